r"""Sim graph: the launched sim graph measured while the world runs in real time.

Per method (``--methods``) one phase: the nodes of the launch's sim graph
(:func:`heisd_ros.nodes.graph.nodes_for` with ``sim=True``: policy, retrieval and sim node)
run as processes on a private DDS domain, each with its shipped YAML and the overrides the
launch would give them (:func:`~heisd_ros.nodes.graph.launch_overrides` of ``method``, ``db``,
``task``, ``time_scale`` and ``sim_mode``; in real time that paces the policy at one control
period, ``min_period_s``). The small VLA and draft head are the shipped ones. Once the first
command arrives the graph is measured for ``--duration-s``, then its processes are stopped
(SIGINT, then SIGKILL) before the next method starts.

This process listens with one node spun on its own thread: the two cameras (arrival time and
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

    python -m heisd_ros.tools.sim_graph --db runs/demo/db --task red_block_on_plate \
        --methods ar,heisd --duration-s 60 --json runs/sim_graph.json --report runs/sim_graph.md
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import struct
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from heisd_ros.tools.graph_bench import (
    LOG_FORMAT,
    Children,
    count_log_lines,
    finite_float,
    held_by_reason,
    ros_parameters,
    summary,
)

#: The policy node's /diagnostics status with its counters and step times.
POLICY_DIAGNOSTICS = "policy_node: policy"
#: Camera name -> topic (the sim node's THIRD_PERSON_TOPIC / WRIST_TOPIC).
CAMERAS = ("third_person", "wrist")
#: Child process name of each node of the graph (log file ``<name>.log``).
CHILD_NAMES = {"policy_node": "policy", "retrieval_node": "retrieval", "sim_node": "sim"}
_EPISODE_OVER_RE = re.compile(
    r"\[(?P<t>\d+(?:\.\d+)?)\] \[[^\]]*\]: episode (?P<episode>\d+) over after "
    r"(?P<world_s>\d+(?:\.\d+)?) s \(world\) and (?P<commands>\d+) commands .*?: "
    r"(?P<how>.*?); (?:the next starts|call ~/reset).*?; so far "
    r"(?P<render_ms>\d+(?:\.\d+)?) ms per frame rendered, (?P<skipped>\d+) frames skipped, "
    r"the world slowed (?P<slowed>\d+) times")
BEHIND_NEEDLE = "of world time behind the clock"


# ------------------------------------------------------------------ pure figures
@dataclass(frozen=True)
class Status:
    """One /heisd/episode_status as received: its stamp (s) and the fields that matter."""

    stamp_s: float
    key: tuple  # (suite, task, episode, seed): one episode
    step: int
    done: bool
    success: bool = False
    reason: str = ""


def running_intervals(statuses: Iterable[Status], end_s: float) -> list[tuple[float, float]]:
    """The (start, end) times, s, during which an episode ran.

    An episode runs from its first status that is not done (normally the one with step 0;
    the first one heard when this process joined mid-episode) to its done status; one still
    running ends at ``end_s``. A status of another episode before a done one ends the former
    there. Statuses of an episode after its done status are ignored.
    """
    out: list[tuple[float, float]] = []
    start, key, ended = None, None, set()
    for s in sorted(statuses, key=lambda s: s.stamp_s):
        if s.done:
            if start is not None and s.key == key:
                out.append((start, s.stamp_s))
                start = None
            ended.add(s.key)
        elif s.key not in ended and (start is None or s.key != key):
            if start is not None:
                out.append((start, s.stamp_s))
            start, key = s.stamp_s, s.key
    if start is not None and end_s > start:
        out.append((start, end_s))
    return out


def clip_intervals(intervals: Iterable[tuple[float, float]], start_s: float,
                   end_s: float) -> list[tuple[float, float]]:
    """The parts of ``intervals`` inside [start_s, end_s] (empty parts dropped)."""
    out = []
    for a, b in intervals:
        a, b = max(a, start_s), min(b, end_s)
        if b > a:
            out.append((a, b))
    return out


def within(times_s: Iterable[float], intervals: Sequence[tuple[float, float]]) -> list[list[float]]:
    """``times_s`` sorted and grouped by the interval each lies in (one list per interval)."""
    ordered = sorted(times_s)
    return [[t for t in ordered if a <= t <= b] for a, b in intervals]


def stream_figures(times_s: Iterable[float], intervals: Sequence[tuple[float, float]]) -> dict:
    """Count, rate and largest gap of arrivals over running time only.

    Args:
        times_s: arrival times, s.
        intervals: running intervals (already clipped to the window); arrivals outside them
            do not count and no gap spans two of them.

    Returns:
        ``count``, ``running_s``, ``rate_hz`` (count / running_s; None without running time),
        ``max_gap_ms`` (largest gap between two arrivals of one interval; None when no
        interval holds two) and ``max_gap_end_s`` (the arrival that ended it).
    """
    groups = within(times_s, intervals)
    running = sum(b - a for a, b in intervals)
    count = sum(len(g) for g in groups)
    gaps = [(b - a, b) for g in groups for a, b in zip(g, g[1:], strict=False)]
    gap, end = max(gaps) if gaps else (None, None)
    return {"count": count, "running_s": running,
            "rate_hz": count / running if running > 0 else None,
            "max_gap_ms": gap * 1e3 if gaps else None, "max_gap_end_s": end}


def stall_bound_ms(min_period_s: float, camera_period_s: float,
                   step_p99_ms: float | None) -> float | None:
    """Longest expected gap between two commands, ms: pacing + one frame + a slow step.

    The policy steps at most every ``min_period_s``, then on the next new frame (up to one
    camera period later), and its command is out one step time later. None without a step
    time.
    """
    if step_p99_ms is None or not math.isfinite(step_p99_ms):
        return None
    return (min_period_s + camera_period_s) * 1e3 + step_p99_ms


def stall_held(max_gap_ms: float | None, bound_ms: float | None) -> bool | None:
    """Whether the largest command gap stayed within the bound (None when either is unknown)."""
    if max_gap_ms is None or bound_ms is None:
        return None
    return max_gap_ms <= bound_ms


def episodes_ended(statuses: Iterable[Status], start_s: float, end_s: float) -> dict:
    """Episodes whose done status is stamped in [start_s, end_s]: count, successes, reasons.

    ``commands`` lists each one's executed commands (its final ``step``), in end order.
    """
    done: dict[tuple, Status] = {}
    for s in sorted(statuses, key=lambda s: s.stamp_s):
        if s.done and start_s <= s.stamp_s <= end_s and s.key not in done:
            done[s.key] = s
    ended = list(done.values())
    return {"ended": len(ended), "successes": sum(s.success for s in ended),
            "reasons": dict(Counter(s.reason or "?" for s in ended)),
            "commands": [s.step for s in ended]}


def parse_episode_lines(lines: Iterable[str]) -> list[dict]:
    """The sim's "episode N over ..." log lines (log time ``t``, s), in log order."""
    out = []
    for line in lines:
        m = _EPISODE_OVER_RE.search(line)
        if m:
            out.append({"t": float(m["t"]), "episode": int(m["episode"]),
                        "world_s": float(m["world_s"]), "commands": int(m["commands"]),
                        "how": m["how"], "render_ms": float(m["render_ms"]),
                        "skipped": int(m["skipped"]), "slowed": int(m["slowed"])})
    return out


def sim_log_figures(lines: Sequence[str], start_s: float, end_s: float) -> dict:
    """Rendering cost and lateness of the sim node from its log (module docstring)."""
    episodes = parse_episode_lines(lines)
    before = [e for e in episodes if e["t"] < start_s]
    inside = [e for e in episodes if start_s <= e["t"] <= end_s]
    last = inside[-1] if inside else (before[-1] if before else None)
    base = before[-1] if before else None
    return {
        "episode_lines_in_window": len(inside),
        "render_ms_per_frame": last and last["render_ms"],
        "frames_skipped_so_far": last and last["skipped"],
        "world_slowed_so_far": last and last["slowed"],
        "frames_skipped_in_window": inside[-1]["skipped"] - base["skipped"]
        if inside and base else None,
        "world_slowed_in_window": inside[-1]["slowed"] - base["slowed"]
        if inside and base else None,
        "behind_warnings_in_window": count_log_lines(lines, BEHIND_NEEDLE, start_s, end_s),
        "episodes": inside,
    }


def method_report(raw: dict) -> dict:
    """The figures of one phase from what was recorded (see :func:`run_phase`'s ``raw``)."""
    t0, t1 = raw["window"]
    statuses = [Status(**s) for s in raw["statuses"]]
    running = clip_intervals(running_intervals(statuses, t1), t0, t1)
    commands = raw["commands"]  # (arrival s, stamp s)
    ages_ms = [(t - stamp) * 1e3 for t, stamp in commands
               if any(a <= t <= b for a, b in running)]
    cmd = stream_figures([c[0] for c in commands], running)
    hybrid = [h for h in raw["hybrid"] if t0 <= h[0] <= t1]  # (arrival, total_ms, unverified)
    after, before = raw["policy_after"], raw["policy_before"]
    diag_p99 = finite_float(after, "decode_p99_ms")
    total = summary(h[1] for h in hybrid)
    step_p99, step_source = ((diag_p99, "diagnostics decode_p99_ms") if diag_p99 is not None
                             else (total and total["p99"], "HybridStep total_ms p99"))
    bound = stall_bound_ms(raw["min_period_s"], raw["camera_period_s"], step_p99)
    cameras = {}
    for name in CAMERAS:
        frames = raw["cameras"][name]
        fig = stream_figures([f[0] for f in frames], running)
        fig["transport_ms"] = summary((a - s) * 1e3 for a, s in frames if t0 <= a <= t1)
        cameras[name] = fig
    state = stream_figures(raw["states"], running)
    for fig in (cmd, state, *cameras.values()):  # when, in the window
        fig["max_gap_end_s"] = fig["max_gap_end_s"] and fig["max_gap_end_s"] - t0
    return {
        "window_s": t1 - t0, "running_s": cmd["running_s"],
        "running": [[a - t0, b - t0] for a, b in running],  # s into the window
        "commands": cmd["count"], "command_rate_hz": cmd["rate_hz"],
        "command_age_ms": summary(ages_ms),
        "stall": {"max_gap_ms": cmd["max_gap_ms"], "at_s": cmd["max_gap_end_s"],
                  "bound_ms": bound,
                  "held": stall_held(cmd["max_gap_ms"], bound),
                  "min_period_s": raw["min_period_s"], "camera_period_s": raw["camera_period_s"],
                  "step_p99_ms": step_p99, "step_p99_source": step_source},
        "cameras": cameras,
        "state": state,
        "node_step_ms": {"decode_p50_ms": finite_float(after, "decode_p50_ms"),
                         "decode_p99_ms": diag_p99, "hybrid_total_ms": total,
                         "unverified_share": (sum(h[2] for h in hybrid) / len(hybrid)
                                              if hybrid else None)},
        "held_by_reason": held_by_reason(before, after),
        "episodes": episodes_ended(statuses, t0, t1),
        "sim": sim_log_figures(raw["sim_lines"], t0, t1),
    }


# ------------------------------------------------------------------ Markdown
def _f(value, fmt: str = ".1f") -> str:
    return "n/a" if value is None else format(value, fmt)


def _episodes_cell(ep: dict) -> str:
    reasons = ", ".join(f"{k} {n}" for k, n in sorted(ep["reasons"].items()))
    return f"{ep['successes']}/{ep['ended']}" + (f" ({reasons})" if reasons else "")


def _stall_cell(stall: dict) -> str:
    verdict = {True: "held", False: "EXCEEDED", None: "?"}[stall["held"]]
    return f"{_f(stall['max_gap_ms'], '.0f')} / {_f(stall['bound_ms'], '.0f')} {verdict}"


def format_markdown(result: dict) -> str:
    """The run's two tables: the graph's streams, then the node's steps and the sim's cost."""
    setup = result["setup"]
    lines = [f"## sim graph ({setup['date']})", "",
             f"task {setup['task']}, sim {setup['sim_mode']} at time_scale "
             f"{setup['time_scale']:g}, {setup['duration_s']:g} s per method after the first "
             f"command; rates over the running time of episodes (auto-reset pauses excluded); "
             f"DB {setup['db'] or '(none)'}; DDS domain {setup['domain']}.", "",
             "| method | running s | cmd/s | third / wrist Hz (max gap ms) | state Hz | "
             "cmd age p50 / p99 / max ms | stall: max gap / bound ms | held by reason | "
             "episodes ok/ended (reasons) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in result["methods"].items():
        if r.get("error"):
            lines.append(f"| {name} | failed: {r['error']} |" + " |" * 7)
            continue
        cams = " / ".join(f"{_f(c['rate_hz'])} ({_f(c['max_gap_ms'], '.0f')})"
                          for c in r["cameras"].values())
        age = r["command_age_ms"]
        age_cell = (f"{age['p50']:.0f} / {age['p99']:.0f} / {age['max']:.0f}" if age
                    else "n/a")
        held = ", ".join(f"{k} {n}" for k, n in sorted(r["held_by_reason"].items())) or "none"
        lines.append(f"| {name} | {r['running_s']:.1f} | {_f(r['command_rate_hz'], '.2f')} | "
                     f"{cams} | {_f(r['state']['rate_hz'], '.0f')} | {age_cell} | "
                     f"{_stall_cell(r['stall'])} | {held} | {_episodes_cell(r['episodes'])} |")
    lines += ["", "| method | node step p50 / p99 ms (diag) | HybridStep total_ms p50 / p99 | "
              "unverified share | commands per ended episode | render ms/frame | frames "
              "skipped (window / so far) | world slowed (window / so far) | behind warnings |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in result["methods"].items():
        if r.get("error"):
            continue
        node, sim = r["node_step_ms"], r["sim"]
        tot = node["hybrid_total_ms"]
        tot_cell = f"{tot['p50']:.0f} / {tot['p99']:.0f}" if tot else "n/a"
        lines.append(
            f"| {name} | {_f(node['decode_p50_ms'], '.0f')} / {_f(node['decode_p99_ms'], '.0f')} "
            f"| {tot_cell} | "
            f"{_f(node['unverified_share'], '.2f')} | "
            f"{', '.join(map(str, r['episodes']['commands'])) or '-'} | "
            f"{_f(sim['render_ms_per_frame'])} | {_f(sim['frames_skipped_in_window'], 'd')} / "
            f"{_f(sim['frames_skipped_so_far'], 'd')} | {_f(sim['world_slowed_in_window'], 'd')}"
            f" / {_f(sim['world_slowed_so_far'], 'd')} | {sim['behind_warnings_in_window']} |")
    lines += ["", "Stall bound = min_period_s + one camera period (wall) + the node's step p99 "
              "(/diagnostics decode_p99_ms, else HybridStep total_ms p99). Render cost and "
              "frames skipped 'so far' come from the sim's last \"episode N over\" log line "
              "(since the node started); n/a when no episode ended.", ""]
    return "\n".join(lines)


# ------------------------------------------------------------------ the graph phase
def stamp_from_cdr(data: bytes) -> float:
    """header.stamp, s, of a serialized message whose first field is a std_msgs/Header.

    After the 4-byte CDR encapsulation header come ``stamp.sec`` (int32) and
    ``stamp.nanosec`` (uint32), in the byte order the encapsulation names.
    """
    order = "<" if data[1] & 1 else ">"
    sec, nanosec = struct.unpack_from(order + "iI", data, 4)
    return sec + nanosec * 1e-9


def phase_params(method: str, args, tmp: Path) -> dict[str, Path]:
    """Each sim-graph node's params file: its shipped YAML with the launch's overrides."""
    from heisd_ros.nodes.graph import launch_overrides, nodes_for, write_params_file

    arguments = {"method": method, "db": str(Path(args.db).resolve()) if args.db else "",
                 "task": args.task, "time_scale": str(args.time_scale),
                 "sim_mode": args.sim_mode}
    overrides = launch_overrides(arguments, sim=True)
    return {spec.name: write_params_file(tmp / f"{spec.name}.yaml", spec.name,
                                         overrides.get(spec.name, {}))
            for spec in nodes_for(sim=True)}


class Listener:
    """This process's node on its own executor thread: every arrival, with its time."""

    def __init__(self, context, name: str) -> None:
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray
        from rclpy.executors import SingleThreadedExecutor
        from sensor_msgs.msg import Image, JointState

        from heisd_ros.msg import EECommand, EpisodeStatus, HybridStep
        from heisd_ros.nodes.qos import STATUS_QOS
        from heisd_ros.nodes.sim_node import THIRD_PERSON_TOPIC, WRIST_TOPIC

        self.node = rclpy.create_node(name, context=context)
        self.lock = threading.Lock()
        self.commands: list[tuple[float, float]] = []
        self.cameras: dict[str, list[tuple[float, float]]] = {c: [] for c in CAMERAS}
        self.states: list[float] = []
        self.statuses: list[dict] = []
        self.hybrid: list[tuple[float, float, bool]] = []
        self.diagnostics: dict[str, dict[str, str]] = {}
        self.diagnostics_at = 0.0  # arrival of the latest policy diagnostics
        node = self.node
        # Images and states only for their times: taken serialized, the stamp read from CDR.
        for camera, topic in zip(CAMERAS, (THIRD_PERSON_TOPIC, WRIST_TOPIC), strict=True):
            node.create_subscription(Image, topic, self._on_frame(camera), 10, raw=True)
        node.create_subscription(JointState, "/joint_states",
                                 lambda _data: self.states.append(time.time()), 50, raw=True)
        node.create_subscription(EECommand, "/heisd/ee_command", self._on_command, 100)
        node.create_subscription(EpisodeStatus, "/heisd/episode_status", self._on_status,
                                 STATUS_QOS)
        node.create_subscription(HybridStep, "/heisd/hybrid_step", self._on_step, 100)
        node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, 50)
        self.executor = SingleThreadedExecutor(context=context)
        self.executor.add_node(node)
        self.thread = threading.Thread(target=self.executor.spin, name=name, daemon=True)
        self.thread.start()

    def _on_frame(self, camera: str):
        frames = self.cameras[camera]

        def on_frame(data: bytes) -> None:
            frames.append((time.time(), stamp_from_cdr(data)))
        return on_frame

    def _on_command(self, msg) -> None:
        from heisd_ros.nodes.robot_msgs import stamp_to_seconds

        self.commands.append((time.time(), stamp_to_seconds(msg.header.stamp)))

    def _on_status(self, msg) -> None:
        from heisd_ros.nodes.robot_msgs import stamp_to_seconds

        self.statuses.append({"stamp_s": stamp_to_seconds(msg.header.stamp),
                              "key": (msg.suite, msg.task, int(msg.episode), int(msg.seed)),
                              "step": int(msg.step), "done": bool(msg.done),
                              "success": bool(msg.success), "reason": str(msg.reason)})

    def _on_step(self, msg) -> None:
        self.hybrid.append((time.time(), float(msg.total_ms),
                            bool(msg.verify_skipped) or int(msg.unverified_run) > 0))

    def _on_diag(self, msg) -> None:
        with self.lock:
            for status in msg.status:
                self.diagnostics[status.name] = {kv.key: kv.value for kv in status.values}
                if status.name == POLICY_DIAGNOSTICS:
                    self.diagnostics_at = time.time()

    def policy_diagnostics(self) -> dict[str, str]:
        """A copy of the latest policy diagnostics values."""
        with self.lock:
            return dict(self.diagnostics.get(POLICY_DIAGNOSTICS, {}))

    def close(self) -> None:
        """Stop the executor thread and destroy the node."""
        self.executor.shutdown()
        self.thread.join(timeout=5.0)
        self.node.destroy_node()


def _died(children: Children) -> str:
    return "; ".join(children.dead())


def run_phase(method: str, args, tmp: Path, env: dict, context) -> dict:
    """One method: start the graph, wait for its first command, measure, stop; the raw data.

    Returns ``{"method", "error", "logs", ...}``; without an error also ``raw`` (for
    :func:`method_report`) and ``ready_after_s``.
    """
    from heisd_ros.nodes.graph import nodes_for

    phase_dir = tmp / method
    phase_dir.mkdir(parents=True, exist_ok=True)
    files = phase_params(method, args, phase_dir)
    policy_cfg = ros_parameters(files["policy_node"])
    sim_cfg = ros_parameters(files["sim_node"])
    camera_period_s = 1.0 / (float(sim_cfg["third_person_rate_hz"])
                             * float(sim_cfg["time_scale"]))
    children = Children(phase_dir, env)
    result: dict = {"method": method, "error": None, "logs": {}}
    listener = None
    try:
        listener = Listener(context, f"sim_graph_{method}")
        for spec in reversed(nodes_for(sim=True)):  # the sim first: its first reset is slow
            children.start(CHILD_NAMES[spec.name], spec.module, files[spec.name])
        result["logs"] = {k: str(v) for k, v in children.logs.items()}
        started = time.monotonic()
        while not listener.commands:
            if _died(children):
                result["error"] = f"before the first command: {_died(children)}"
                return result
            if time.monotonic() - started > args.ready_timeout_s:
                result["error"] = f"no command within {args.ready_timeout_s:g} s"
                return result
            time.sleep(0.1)
        result["ready_after_s"] = time.monotonic() - started
        ready_wall = time.time()
        deadline = time.monotonic() + 3.0  # a policy diagnostics sample from after the start
        while listener.diagnostics_at < ready_wall and time.monotonic() < deadline:
            time.sleep(0.05)
        before = listener.policy_diagnostics()
        t0 = time.time()
        end = time.monotonic() + args.duration_s
        while time.monotonic() < end:
            if _died(children):
                result["error"] = f"during the measurement: {_died(children)}"
                break
            time.sleep(0.1)
        t1 = time.time()
        after = listener.policy_diagnostics()
        time.sleep(0.3)  # statuses and frames of the window's end still in flight
    finally:
        children.stop()
        if listener is not None:
            listener.close()
    sim_log = children.logs["sim"].read_text(errors="replace").splitlines()
    result["raw"] = {
        "window": [t0, t1], "commands": list(listener.commands),
        "cameras": {k: list(v) for k, v in listener.cameras.items()},
        "states": list(listener.states), "statuses": list(listener.statuses),
        "hybrid": list(listener.hybrid), "policy_before": before, "policy_after": after,
        "sim_lines": sim_log, "min_period_s": float(policy_cfg.get("min_period_s", 0.0)),
        "camera_period_s": camera_period_s}
    return result


def _tail(path: str, lines: int = 20) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# ------------------------------------------------------------------ the run
def parse_args(argv=None) -> argparse.Namespace:
    """The command line (module docstring)."""
    from heisd_ros.nodes.graph import METHODS

    p = argparse.ArgumentParser(prog="python -m heisd_ros.tools.sim_graph",
                                description=__doc__.split("\n")[0])
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
    return p.parse_args(argv)


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


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv=None) -> int:
    """Run every method's phase, print the tables; 1 when a phase failed, 2 on bad arguments."""
    args = parse_args(argv)
    try:
        methods = check_args(args)
    except ValueError as exc:
        print(f"sim_graph: {exc}", file=sys.stderr)
        return 2
    import rclpy
    from rclpy.signals import SignalHandlerOptions

    from heisd_ros.testing.domains import allocate_domain

    domain = allocate_domain()  # held for this process: no test or other tool shares it
    tmp = Path(tempfile.mkdtemp(prefix="heisd_sim_graph_"))
    env = {**os.environ, "ROS_DOMAIN_ID": str(domain),
           "RCUTILS_CONSOLE_OUTPUT_FORMAT": LOG_FORMAT, "PYTHONUNBUFFERED": "1"}
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=domain,
               signal_handler_options=SignalHandlerOptions.NO)
    reports: dict[str, dict] = {}
    failures = []
    try:
        for method in methods:
            print(f"[sim-graph] {method}: starting policy, retrieval and sim node (domain "
                  f"{domain}, logs in {tmp / method})", flush=True)
            phase = run_phase(method, args, tmp, env, context)
            if phase["error"]:
                failures.append(method)
                print(f"[sim-graph] {method}: FAILED: {phase['error']}", file=sys.stderr)
                for name, log in phase["logs"].items():
                    if name in phase["error"] or name == "policy":
                        print(f"--- {name} log tail ({log}):\n{_tail(log)}", file=sys.stderr)
                reports[method] = {"error": phase["error"], "logs": phase["logs"]}
                continue
            report = method_report(phase["raw"])
            report.update(ready_after_s=phase["ready_after_s"], logs=phase["logs"])
            reports[method] = report
            print(f"[sim-graph] {method}: done after {phase['ready_after_s']:.0f} s to the "
                  f"first command + {report['window_s']:.0f} s: {report['commands']} commands "
                  f"in {report['running_s']:.1f} s of episodes, "
                  f"{report['episodes']['ended']} episodes ended", flush=True)
    except KeyboardInterrupt:
        print("[sim-graph] interrupted", file=sys.stderr)
        return 130
    finally:
        rclpy.shutdown(context=context)
        signal.signal(signal.SIGTERM, previous)
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


if __name__ == "__main__":
    sys.exit(main())
