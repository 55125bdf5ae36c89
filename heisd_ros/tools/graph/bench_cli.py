r"""heisd-bench graph: the policy inside the running ROS graph vs the same decoder in one process.

Per method (``--methods``, default ``ar,drafter`` and, with ``--db``, ``heisd``) one graph
phase, then one in-process phase:

1. Graph: the PIPER driver (emulated arm, real piper_sdk on python-can's virtual bus; its
   /joint_states and /ee_pose remapped to /driver/..., so the robot state the policy sees is
   this bench's), for ``heisd`` the retrieval node on ``--db``, and the policy node with the
   shipped YAML (its own freshness limits; ``warn_throttle_s`` 0 so every held step is
   logged) run as processes on a private DDS domain. This process plays a real robot's
   inputs: both cameras at ``--camera-hz`` stamped when taken (one demonstration observation
   per frame, the episodes looped) and the robot state of the shown observation at
   ``--state-hz``. It listens to /heisd/ee_command, /heisd/hybrid_step and /diagnostics and,
   once the policy is ready (first command or first held step), measures ``--duration-s``.
2. In-process: after the graph's processes exited (the retrieval node locks the embedded DB),
   the node's decoder is built here the way the decode worker builds it
   (``heisd_ros.nodes.policy_decoders``, which calls ``heisd_ros.decoding.builder``) and
   decodes the observations the node decoded, in the node's order (from the HybridStep
   stamps; with no command sent, as many consecutive replayed observations).

Figures and their sources (the report repeats this):

- node step time, wall-clock: with no command sent in the window, the policy log's held
  steps ("decode took N ms", every decoded step of the window); else the policy's
  /diagnostics ``decode_p50_ms``/``decode_p99_ms`` (its last ``latency_window`` decoded
  steps, sent and held; steps before the window count too) when the node reports them, else
  the held steps' log times only.
- node step time, decoder's own: HybridStep.total_ms of the steps sent in the window.
- in-process: ``time.perf_counter`` around each ``decode`` call, and the decoder's total_ms.
- command rate and age: EECommand arrivals here (arrival time - header.stamp).
- held steps by reason: the change of the policy's ``refused[<kind>]`` diagnostics over the
  window (sampled once per diagnostics period).
- HybridStep status by method: per step sent in the window, its ``status`` (runs of digits
  replaced by ``N`` so that timings group; the 4 most common), the share of each
  ``draft_source`` and of ``verify_skipped``.

Retrieval fault drills (``--retrieval-fault``, for the methods that use retrieval, e.g.
``heisd``; the policy keeps ``model.db_dir`` = ``--db`` for its router statistics and
calibration):

- ``killed``: the real retrieval node is started and SIGKILLed when the measurement window
  starts (after the policy is ready). Until DDS notices (lease expiry) each call waits out its
  deadline; then the client reports the service unavailable.
- ``slow``: ``heisd_ros.nodes.retrieval_fault --mode slow`` answers every request after
  ``--fault-delay-s`` (0.5 s), well past the client's deadline.
- ``empty``: ``heisd_ros.nodes.retrieval_fault --mode empty`` answers at once with no candidates.

The policy should keep sending commands in drafter mode, at about the drafter method's rate,
each step naming the fault in its HybridStep ``status``. The in-process phase of a faulted
method is skipped (in this process the decoder would have a working store: not the same
situation); its in-process figures read "n/a (fault drill)".

Example (after ``source .heisd-env.sh``)::

    heisd-bench graph --methods ar --duration-s 20
    heisd-bench graph --db runs/demo/db --methods ar,drafter,heisd --duration-s 60 \
        --json runs/graph_bench.json --report runs/graph_bench
    heisd-bench graph --db runs/demo/db --methods drafter,heisd --retrieval-fault slow \
        --duration-s 20
    heisd-bench graph --methods drafter --duration-s 60 --json runs/graph_age.json

The last one measures command age at the robot's rates: the "Commands at the driver" table
(per method ``age_ms`` p50 / p99 / max, ``over_policy_limit`` and ``over_driver_limit`` in
the JSON).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from heisd_ros.tools.graph.inprocess import InProcess, inprocess_order
from heisd_ros.tools.graph.phases import (
    RETRIEVAL_FAULTS,
    policy_overrides,
    run_graph_phase,
    write_phase_params,
)
from heisd_ros.tools.graph.processes import (
    NodeProcesses,
    dds_domain_id,
    graph_env,
    private_context,
    ros_parameters,
)
from heisd_ros.tools.graph.replay import load_replay
from heisd_ros.tools.graph.report import (
    FAULT_NA,
    RATE_FRACTION,
    format_markdown,
    heisd_vs_ar,
    method_report,
    plot_step_times,
    rate_vs_drafter,
)

#: Methods of one run: ``heisd`` only with ``--db``.
METHODS_WITHOUT_DB = ("ar", "drafter")
METHODS_WITH_DB = ("ar", "drafter", "heisd")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``heisd-bench graph``."""
    parser.add_argument("--methods", default=None,
                        help="comma-separated policy methods (default: ar,drafter; with --db "
                             "ar,drafter,heisd)")
    parser.add_argument("--db", default=None, help="DB directory from heisd-build-db: the "
                        "retrieval node's store, the policy's model.db_dir and the replayed "
                        "demonstrations (its held-out episodes)")
    parser.add_argument("--demos", default=None, help="npz root to replay instead of the DB's "
                        "held-out episodes")
    parser.add_argument("--task", default=None, help="replay this task's demonstrations "
                        "(default: the first episode's)")
    parser.add_argument("--duration-s", type=float, default=60.0,
                        help="measured time per method, after the policy is ready")
    parser.add_argument("--camera-hz", type=float, default=30.0)
    parser.add_argument("--state-hz", type=float, default=200.0,
                        help="/joint_states + /ee_pose rate (the PIPER's)")
    parser.add_argument("--image-px", type=int, default=224,
                        help="published image size (the real cameras'); 0 = as recorded")
    parser.add_argument("--observations", type=int, default=450,
                        help="observations replayed (one per frame), then looped")
    parser.add_argument("--ready-timeout-s", type=float, default=300.0)
    parser.add_argument("--inprocess-max", type=int, default=400,
                        help="most observations decoded in the in-process phase")
    parser.add_argument("--warmup", type=int, default=2,
                        help="untimed in-process decodes before the timed ones")
    parser.add_argument("--seed", type=int, default=0, help="synthetic scenes (without --db)")
    parser.add_argument("--policy-param", action="append", default=[], metavar="KEY=VALUE",
                        help="override a policy parameter of config/policy_node.yaml (e.g. "
                             "decode_worker=false); repeatable. Default: the shipped values")
    parser.add_argument("--retrieval-fault", choices=RETRIEVAL_FAULTS, default="none",
                        help="fault drill for the methods that use retrieval (heisd): killed "
                             "= SIGKILL the retrieval node when the window starts; slow = a "
                             "stand-in that answers after --fault-delay-s; empty = a stand-in "
                             "that answers with no candidates. Their in-process phase is "
                             "skipped")
    parser.add_argument("--fault-delay-s", type=float, default=0.5,
                        help="--retrieval-fault slow: the stand-in's answer delay, s")
    parser.add_argument("--json", default=None, help="write every figure here")
    parser.add_argument("--report", default=None, metavar="DIR",
                        help="write report.md (and step_times.png) here")


def parse_methods(args) -> list[str]:
    """``--methods`` checked; hybrid methods need ``--db`` (ValueError)."""
    from heisd_ros.decoding.methods import METHODS, check_method

    default = METHODS_WITH_DB if args.db else METHODS_WITHOUT_DB
    names = [m.strip() for m in (args.methods or ",".join(default)).split(",") if m.strip()]
    for name in names:
        check_method(name, "--methods")
        if METHODS[name].hybrid and not args.db:
            raise ValueError(f"--methods: {name!r} needs a retrieval DB; pass --db")
    return list(dict.fromkeys(names))


def check_fault(args, methods: Sequence[str]) -> None:
    """``--retrieval-fault`` needs a method that uses retrieval; the delay >= 0 (ValueError)."""
    from heisd_ros.decoding.methods import METHODS

    if args.retrieval_fault != "none" and not any(METHODS[m].hybrid for m in methods):
        raise ValueError(f"--retrieval-fault {args.retrieval_fault}: none of the methods "
                         f"{','.join(methods)} uses retrieval (e.g. heisd)")
    if not (math.isfinite(args.fault_delay_s) and args.fault_delay_s >= 0):
        raise ValueError(f"--fault-delay-s: expected a value >= 0, got {args.fault_delay_s}")



def run(args) -> int:
    """``heisd-bench graph``: every method's phases, the table, --json and --report."""
    try:
        methods = parse_methods(args)
        check_fault(args, methods)
        policy_overrides(args.policy_param)
        if args.db and not (Path(args.db) / "offline_stats.json").is_file():
            raise ValueError(f"--db: no offline_stats.json in {args.db}")
        replay = load_replay(args)
    except ValueError as exc:
        print(f"heisd-bench graph: {exc}", file=sys.stderr)
        return 2
    domain = dds_domain_id()
    tmp = Path(tempfile.mkdtemp(prefix="heisd_graph_bench_"))
    children, inproc = NodeProcesses(tmp, graph_env(domain)), InProcess()
    reports, raw, threads = {}, {}, None
    print(f"[graph] domain {domain}; {replay.description}; images {replay.image_note}",
          flush=True)
    with private_context(domain) as context:
        try:
            for method in methods:
                files = write_phase_params(method, args, replay, tmp)
                policy_cfg = ros_parameters(files["policy"])
                threads = policy_cfg["model"]["threads"]
                try:
                    phase = run_graph_phase(method, args, replay, files, tmp, context, children)
                finally:
                    children.stop()
                phase["load_avg_1min"] = os.getloadavg()[0]
                raw[method] = {"phase": {k: v for k, v in phase.items() if k != "diagnostics"},
                               "diagnostics": phase.get("diagnostics")}
                reports[method] = _method(method, args, replay, files, phase, children,
                                          inproc, raw[method])
        except KeyboardInterrupt:
            print("[graph] interrupted: stopping the graph", file=sys.stderr)
            return 130
        finally:
            children.stop()
    result = {
        "setup": {"date": time.strftime("%Y-%m-%d %H:%M"), "duration_s": args.duration_s,
                  "camera_hz": args.camera_hz, "state_hz": args.state_hz,
                  "image": replay.image_note, "observations": replay.description,
                  "instruction": replay.instruction, "task": replay.task, "domain": domain,
                  "threads": threads, "logs": str(tmp), "methods": methods,
                  "rate_fraction": RATE_FRACTION,
                  "policy_param": policy_overrides(args.policy_param),
                  "retrieval_fault": args.retrieval_fault,
                  "fault_delay_s": args.fault_delay_s if args.retrieval_fault == "slow"
                  else None},
        "methods": reports, "heisd_vs_ar": heisd_vs_ar(
            {m: r for m, r in reports.items()
             if not r.get("error") and not r.get("retrieval_fault")}),
        "rate_vs_drafter": rate_vs_drafter(reports),
        "raw": raw,
    }
    markdown = format_markdown(result)
    print(markdown)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2, default=_jsonable) + "\n")
    if args.report:
        out = Path(args.report)
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.md").write_text(markdown)
        plot_step_times(raw, out / "step_times.png")
    return 0 if all(not r.get("error") for r in reports.values()) else 1


def _method(method: str, args, replay, files: dict[str, Path], phase: dict,
            children: NodeProcesses, inproc: InProcess, raw: dict) -> dict:
    """One method's report from its graph phase, after its in-process phase (``raw`` gets it)."""
    policy_cfg = ros_parameters(files["policy"])
    driver_cfg = ros_parameters(files["driver"])
    problem = phase["error"] or phase["died"]
    if problem:
        print(f"[graph] {method}: {problem}", file=sys.stderr)
        for name in phase["logs"]:
            tail = children.tail(name)
            if tail and (name == "policy" or name in problem):
                print(f"--- {name} log tail ({phase['logs'][name]}):\n{tail}", file=sys.stderr)
    if phase["error"]:
        return {"error": phase["error"], "logs": phase["logs"]}
    fault = phase["retrieval_fault"]
    if fault:
        how = (f"fault drill ({fault['how']}): in-process phase skipped (this process "
               f"would decode with a working store)")
    else:
        order, advance, how = inprocess_order(phase, len(replay), args.inprocess_max)
    print(f"[graph] {method}: graph done ({len(phase['ages_s'])} commands, "
          f"{len(phase['held_ms'])} held stale); {how}", flush=True)
    if fault:
        inproc_raw = {"skipped": FAULT_NA, "decoder": "", "load_avg_1min": None}
    else:
        store = (ros_parameters(files["retrieval"])["store"] if "retrieval" in files
                 else None)
        inproc_raw = inproc.run(method, policy_cfg["model"], store, replay, order, advance,
                                args.warmup)
        inproc_raw["load_avg_1min"] = os.getloadavg()[0]
        raw["inprocess"] = inproc_raw
    report = method_report(phase, inproc_raw, float(policy_cfg["max_command_age_s"]),
                           driver_cfg.get("controller", {}).get("max_command_age_s"))
    report.update(inprocess_order=how, died=phase["died"], logs=phase["logs"],
                  inprocess_decoder=inproc_raw["decoder"],
                  load_avg_1min={"graph_end": phase["load_avg_1min"],
                                 "inprocess_end": inproc_raw["load_avg_1min"]})
    return report


def _jsonable(value):
    if isinstance(value, np.generic):
        return value.item()
    return str(value)
