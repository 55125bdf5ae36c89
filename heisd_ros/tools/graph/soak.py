r"""heisd-bench soak: the real-time sim graph for a long run, reported in windows.

The launch's sim graph (policy, retrieval and sim node as processes, each with its shipped
YAML and the launch's overrides, as ``heisd-bench sim-graph`` starts them:
:func:`.phases.sim_phase_params`) runs episodes back to back (the sim's auto-reset) for
``--duration-min`` after the first command; every ``--window-min`` the tool closes a window.
Figures per window and their sources:

- commands: EECommand arrivals at this listener; the rate over the window's running time of
  episodes (the auto-reset pauses excluded, as in sim-graph) and over the whole window.
- command age (arrival here - header.stamp) p50/p99/max of the commands that arrived while
  an episode ran, and how many of them were older than the policy's ``max_command_age_s``
  (the policy holds older ones itself: "stale command", in held by reason).
- commands executed past the age limit, and refused for it: the sim node's own counters on
  /diagnostics ("sim_node: commands"). Like the driver, the sim refuses a command on frames
  older than its ``max_command_age_s`` when the arm would take it.
- held steps by reason: change of the policy's /diagnostics ``refused[<kind>]`` counters over
  the window; the most common HybridStep status texts (digits as ``N``).
- episodes ended and successes: /heisd/episode_status done statuses of the window.
- RSS (``VmRSS`` of /proc/<pid>/status) at the window's end and its largest sample, and CPU
  (% of one core: utime + stime of /proc/<pid>/stat over the wall time between samples) of
  each node process and of each process they started (``policy/decode_worker``). Linux only.
- tracebacks: lines with "Traceback" written to each node's log in the window (a process's
  children write to its log); exits (a node process ended; the soak then stops) and
  restarts (a process of the same name came back with another pid).

The listener keeps at most :data:`LISTENER_KEEP` records per topic and is drained at every
window's end, so the tool's own memory does not grow with the duration. After each window
``soak.json`` (every figure, the verdict so far) is rewritten in ``--out``; at the end also
``soak.md`` (a table per window) and ``soak.png`` (with the ``report`` extra: matplotlib).
The verdict against the goals (:func:`.soak_report.soak_verdict`) is printed last; the exit
code is 0 when it passed, 1 when not, 2 on bad arguments.

Example (after ``source .heisd-env.sh``)::

    heisd-bench soak --db runs/demo/db --duration-min 60 --window-min 5 --out runs/soak
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import deque
from pathlib import Path

from heisd_ros.tools.graph.listener import POLICY_DIAGNOSTICS, SIM_DIAGNOSTICS, GraphListener
from heisd_ros.tools.graph.phases import sim_phase_params, start_sim_graph
from heisd_ros.tools.graph.processes import (
    NodeProcesses,
    dds_domain_id,
    graph_env,
    private_context,
    ros_parameters,
)
from heisd_ros.tools.graph.soak_procs import LogScanner, ProcessSampler
from heisd_ros.tools.graph.soak_report import (
    format_markdown,
    format_verdict,
    plot_windows,
    soak_verdict,
    window_figures,
)

#: Newest records the listener keeps per topic between two drains (a backstop: ~10/s flow).
LISTENER_KEEP = 50_000
#: Longest time between two /proc samples of the processes, s.
SAMPLE_S = 10.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``heisd-bench soak`` (module docstring)."""
    p.add_argument("--db", default="", help="DB directory from heisd-build-db (launch "
                   "argument db; needed by methods that use retrieval, e.g. heisd)")
    p.add_argument("--task", default="red_block_on_plate", help="sim task (launch argument)")
    p.add_argument("--method", default="heisd", help="policy method (launch argument)")
    p.add_argument("--duration-min", type=float, default=60.0,
                   help="soak wall time, minutes after the first command")
    p.add_argument("--window-min", type=float, default=5.0, help="report window, minutes")
    # Seconds for short runs (tests); they win over the minutes.
    p.add_argument("--duration-s", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--window-s", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--ready-timeout-s", type=float, default=300.0,
                   help="longest wait for the first command")
    p.add_argument("--out", default=None, help="directory of soak.json, soak.md, soak.png and "
                   "the node logs (default runs/soak_<date>_<time>)")


def check_args(args) -> tuple[str, float, float]:
    """(method, duration s, window s); ValueError naming the bad option."""
    from heisd_ros.tools.graph.sim_cli import check_args as check_sim_args

    duration_s = args.duration_s if args.duration_s is not None else args.duration_min * 60.0
    window_s = args.window_s if args.window_s is not None else args.window_min * 60.0
    if "," in args.method:
        raise ValueError(f"--method: one method, got {args.method!r}")
    # sim-graph's checks: the method, its DB, the task, the duration.
    sim = argparse.Namespace(methods=args.method, db=args.db, task=args.task,
                             duration_s=duration_s, time_scale=1.0)
    try:
        (method,) = check_sim_args(sim)
    except ValueError as exc:
        raise ValueError(str(exc).replace("--methods", "--method")
                         .replace("--duration-s", "--duration-min")) from None
    if not (math.isfinite(window_s) and 0 < window_s <= duration_s):
        raise ValueError(f"--window-min: expected > 0 and at most the duration, got "
                         f"{window_s / 60:g} min")
    return method, duration_s, window_s


def drain(records: deque) -> list:
    """Take the records that arrived so far out of a listener list (appends go on)."""
    return [records.popleft() for _ in range(len(records))]


def record_windows(children: NodeProcesses, listener: GraphListener, duration_s: float,
                   window_s: float, age_limit_s: float, on_window) -> None:
    """Close a window every ``window_s`` until ``duration_s`` or a node exits.

    ``on_window(figures)`` gets each window's :func:`.soak_report.window_figures`.
    """
    from tqdm import tqdm

    sampler = ProcessSampler({name: proc.pid for name, proc in children.procs.items()})
    scanner = LogScanner(children.logs)
    n_windows = math.ceil(duration_s / window_s - 1e-9)
    sample_s = min(SAMPLE_S, window_s / 4)
    start = time.monotonic()
    t0 = time.time()
    last = sampler.sample(t0)
    exited: set[str] = set()
    drain(listener.commands)  # before the soak: not counted
    drain(listener.steps)
    statuses = drain(listener.statuses)
    carried = statuses[-1] if statuses else None
    before = listener.diagnostics_of(POLICY_DIAGNOSTICS)
    sim_before = listener.diagnostics_of(SIM_DIAGNOSTICS)
    # A bar line every 2 s at most: an hour's progress in a log stays small.
    with tqdm(total=round(duration_s), unit="s", desc="soak", file=sys.stderr,
              mininterval=2.0) as bar:
        for k in range(n_windows):
            end = start + min((k + 1) * window_s, duration_s)
            samples = {name: [s] for name, s in last.items()}
            events: list[str] = []
            next_sample = time.monotonic() + sample_s
            while (now := time.monotonic()) < end and not exited:
                time.sleep(min(0.5, end - now))
                bar.update(min(bar.total, round(time.monotonic() - start)) - bar.n)
                for death in children.dead():
                    exited.add(death)
                    events.append(death)
                if time.monotonic() >= next_sample:
                    next_sample += sample_s
                    _add_samples(samples, sampler.sample(time.time()), events, sampler)
            t1 = time.time()
            last = sampler.sample(t1)
            _add_samples(samples, last, events, sampler)
            statuses = drain(listener.statuses)
            raw = {"start_s": t0, "end_s": t1, "commands": [
                (c.arrival_s, c.stamp_s) for c in drain(listener.commands)],
                "statuses": statuses, "carried": carried,
                "step_statuses": [s.status for s in drain(listener.steps)],
                "policy_before": before,
                "policy_after": (after := listener.diagnostics_of(POLICY_DIAGNOSTICS)),
                "sim_before": sim_before,
                "sim_after": (sim_after := listener.diagnostics_of(SIM_DIAGNOSTICS)),
                "processes": samples, "tracebacks": scanner.count("Traceback"),
                "events": events}
            figures = window_figures(raw, age_limit_s)
            on_window(figures)
            bar.set_postfix_str(f"window {k + 1}/{n_windows}: "
                                f"{figures['commands']} commands, "
                                f"{figures['episodes']['ended']} episodes")
            t0, before, sim_before = t1, after, sim_after
            carried = statuses[-1] if statuses else carried
            if exited:
                break


def _add_samples(samples: dict, now: dict, events: list, sampler: ProcessSampler) -> None:
    for name, sample in now.items():
        samples.setdefault(name, []).append(sample)
    events.extend(sampler.take_events())


def run(args) -> int:
    """The soak; the verdict's exit code (module docstring)."""
    try:
        method, duration_s, window_s = check_args(args)
    except ValueError as exc:
        print(f"heisd-bench soak: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out or f"runs/soak_{time.strftime('%Y%m%d_%H%M%S')}")
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    phase = argparse.Namespace(db=args.db, task=args.task, time_scale=1.0, sim_mode="realtime")
    files = sim_phase_params(method, phase, logs)
    age_limit_s = float(ros_parameters(files["policy_node"])["max_command_age_s"])
    domain = dds_domain_id()  # held for this process: no test or other tool shares it
    children = NodeProcesses(logs, graph_env(domain))
    result = {"setup": {"date": time.strftime("%Y-%m-%d %H:%M"), "method": method,
                        "task": args.task, "db": args.db, "duration_s": duration_s,
                        "window_s": window_s, "age_limit_s": age_limit_s, "domain": domain,
                        "logs": str(logs)},
              "windows": [], "verdict": None}

    def on_window(figures: dict) -> None:
        result["windows"].append(figures)
        result["verdict"] = soak_verdict(result["windows"])
        (out / "soak.json").write_text(json.dumps(result, indent=2) + "\n")

    print(f"[soak] {method}: starting policy, retrieval and sim node (domain {domain}, logs "
          f"in {logs})", flush=True)
    error = ""
    with private_context(domain) as context:
        listener = GraphListener.on_own_thread(context, "heisd_soak", episodes=True,
                                               keep=LISTENER_KEEP)
        try:
            error = start_sim_graph(children, files, listener, args.ready_timeout_s)
            if not error:
                print(f"[soak] first command; {duration_s / 60:.3g} min in windows of "
                      f"{window_s / 60:.3g} min", flush=True)
                record_windows(children, listener, duration_s, window_s, age_limit_s,
                               on_window)
        except KeyboardInterrupt:
            print("[soak] interrupted: reporting the windows so far", file=sys.stderr)
        finally:
            children.stop()
            listener.close()
    if error:
        print(f"[soak] FAILED: {error}", file=sys.stderr)
        for name in children.logs:
            print(f"--- {name} log tail:\n{children.tail(name)}", file=sys.stderr)
        return 1
    result["verdict"] = soak_verdict(result["windows"])
    (out / "soak.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "soak.md").write_text(format_markdown(result))
    png = plot_windows(result["windows"], out / "soak.png")
    print(f"[soak] wrote {out / 'soak.json'}, {out / 'soak.md'}"
          + (f", {png}" if png else " (no soak.png: matplotlib is missing)"))
    print(format_verdict(result["verdict"]))
    return 0 if result["verdict"]["passed"] else 1
