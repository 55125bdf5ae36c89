r"""heisd-bench sim-graph: the launched sim graph measured while the world runs in real time.

Per method (``--methods``) one phase: the nodes of the launch's sim graph
(:func:`heisd_ros.nodes.graph.nodes_for` with ``sim=True``: policy, retrieval and sim node)
run as processes on a private DDS domain, each with its shipped YAML and the overrides the
launch would give them (:func:`~heisd_ros.nodes.graph.launch_overrides` of ``method``, ``db``,
``task``, ``time_scale`` and ``sim_mode``; in real time that paces the policy at one control
period, ``min_period_s``). The small VLA and draft head are the shipped ones. Once the first
command arrives the graph is measured for ``--duration-s``, then its processes are stopped
(SIGINT, then SIGKILL) before the next method starts.

This process listens with one node spun on its own thread
(:class:`heisd_ros.tools.graph.listener.GraphListener`): the two cameras (arrival time and
header stamp), /heisd/ee_command, /heisd/episode_status, /joint_states, /diagnostics and
/heisd/hybrid_step. Figures and their sources:

- running time: an episode runs from its status with step 0 (not done) to its done status
  (statuses' header stamps); the auto-reset pauses between episodes do not count. Rates and
  gaps below are over the running time of the window only, and a gap never spans two
  episodes.
- command rate, command age at the sim (arrival here - header.stamp, the stamp being the
  frames' time the action was decided on), the largest gap between two commands of one
  episode (a stall) against the bound ``min_period_s + one camera period (wall) + the node's
  step p99`` (the policy's /diagnostics ``decode_p99_ms``, else HybridStep ``total_ms`` p99).
- camera and /joint_states rates and largest gaps, from their arrival times here.
- node step time: /diagnostics ``decode_p50_ms``/``decode_p99_ms`` (its last decoded steps)
  and HybridStep ``total_ms`` of the window; unverified share: HybridStep steps of the window
  run without the target VLA (``verify_skipped`` or ``unverified_run`` > 0).
- held steps by reason: change of the policy's ``refused[<kind>]`` counters over the window.
- episodes ended in the window (done statuses): successes, reasons, commands each (``step``).
- rendering cost per frame, frames skipped and world slow-downs: the sim's "episode N over
  ..." log lines (figures since the node started, at the last episode end); frames skipped
  in the window when an episode also ended before it; "behind the clock" warnings (throttled
  to one per 5 s) in the window.

Example (after ``source .heisd-env.sh``)::

    heisd-bench sim-graph --db runs/demo/db --task red_block_on_plate \
        --methods ar,heisd --duration-s 60 --json runs/sim_graph.json --report runs/sim_graph.md
"""


from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

from heisd_ros.tools.graph.phases import run_sim_phase
from heisd_ros.tools.graph.processes import dds_domain_id, graph_env, private_context, tail_of
from heisd_ros.tools.graph.sim_report import format_markdown, method_report


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``heisd-bench sim-graph`` (module docstring)."""
    from heisd_ros.nodes.graph import METHODS

    p.add_argument("--db", default="", help="DB directory from heisd-build-db (launch "
                   "argument db; needed by methods that use retrieval, e.g. heisd)")
    p.add_argument("--task", default="red_block_on_plate", help="sim task (launch argument)")
    p.add_argument("--methods", default="ar,heisd",
                   help=f"comma-separated policy methods, of {', '.join(METHODS)}")
    p.add_argument("--duration-s", type=float, default=60.0,
                   help="measured wall time per method, after the first command")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="world s per wall s (launch argument time_scale)")
    p.add_argument("--sim-mode", default="realtime", choices=("realtime", "lockstep"))
    p.add_argument("--ready-timeout-s", type=float, default=300.0,
                   help="longest wait for the first command of a phase")
    p.add_argument("--json", default=None, help="write every figure here")
    p.add_argument("--report", default=None, help="write the Markdown tables here")


def check_args(args) -> list[str]:
    """The methods to run; ValueError for a bad method, a method without its DB or bad values."""
    from heisd_ros.decoding.methods import METHODS, check_method

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not methods:
        raise ValueError("--methods: no method given")
    for name in methods:
        check_method(name, "--methods")
        if METHODS[name].hybrid and not args.db:
            raise ValueError(f"--methods: {name!r} uses retrieval; pass --db")
    import yaml

    from heisd_ros.nodes.graph import config_dir
    from heisd_ros.sim.suites import get_task

    shipped = yaml.safe_load((config_dir() / "sim_node.yaml").read_text())
    get_task(shipped["sim_node"]["ros__parameters"]["suite"], args.task)  # names valid ones
    if args.db and not Path(args.db).is_dir():
        raise ValueError(f"--db: {args.db} is not a directory")
    if not (math.isfinite(args.duration_s) and args.duration_s > 0):
        raise ValueError(f"--duration-s: expected > 0, got {args.duration_s}")
    if not (math.isfinite(args.time_scale) and args.time_scale > 0):
        raise ValueError(f"--time-scale: expected > 0, got {args.time_scale}")
    return list(dict.fromkeys(methods))


def run(args) -> int:
    """Run every method's phase, print the tables; 1 when a phase failed, 2 on bad arguments."""
    try:
        methods = check_args(args)
    except ValueError as exc:
        print(f"heisd-bench sim-graph: {exc}", file=sys.stderr)
        return 2
    domain = dds_domain_id()  # held for this process: no test or other tool shares it
    tmp = Path(tempfile.mkdtemp(prefix="heisd_sim_graph_"))
    env = graph_env(domain)
    reports: dict[str, dict] = {}
    failures = []
    with private_context(domain) as context:
        try:
            for method in methods:
                print(f"[sim-graph] {method}: starting policy, retrieval and sim node (domain "
                      f"{domain}, logs in {tmp / method})", flush=True)
                phase = run_sim_phase(method, args, tmp, env, context)
                if phase["error"]:
                    failures.append(method)
                    print(f"[sim-graph] {method}: FAILED: {phase['error']}", file=sys.stderr)
                    for name, log in phase["logs"].items():
                        if name in phase["error"] or name == "policy":
                            print(f"--- {name} log tail ({log}):\n{tail_of(log)}",
                                  file=sys.stderr)
                    reports[method] = {"error": phase["error"], "logs": phase["logs"]}
                    continue
                report = method_report(phase["raw"])
                report.update(ready_after_s=phase["ready_after_s"], logs=phase["logs"])
                reports[method] = report
                print(f"[sim-graph] {method}: done after {phase['ready_after_s']:.0f} s to the "
                      f"first command + {report['window_s']:.0f} s: {report['commands']} "
                      f"commands in {report['running_s']:.1f} s of episodes, "
                      f"{report['episodes']['ended']} episodes ended", flush=True)
        except KeyboardInterrupt:
            print("[sim-graph] interrupted", file=sys.stderr)
            return 130
    for method, report in reports.items():
        if not report.get("error") and not report["commands"]:
            failures.append(method)
            print(f"[sim-graph] {method}: no command arrived while an episode ran",
                  file=sys.stderr)
    result = {"setup": {"date": time.strftime("%Y-%m-%d %H:%M"), "task": args.task,
                        "db": args.db, "methods": methods, "duration_s": args.duration_s,
                        "time_scale": args.time_scale, "sim_mode": args.sim_mode,
                        "domain": domain, "logs": str(tmp)},
              "methods": reports}
    markdown = format_markdown(result)
    print(markdown)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    if args.report:
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(markdown)
    return 1 if failures else 0

