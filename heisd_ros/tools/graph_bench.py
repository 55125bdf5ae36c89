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
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import yaml

from heisd_ros.decoding.behind import BEHIND_REJECTED

ASSETS = Path(__file__).resolve().parents[1] / "assets"
#: Methods of one run: ``heisd`` only with ``--db``.
METHODS_WITHOUT_DB = ("ar", "drafter")
METHODS_WITH_DB = ("ar", "drafter", "heisd")
#: A command rate at least this share of the in-process decode rate passes.
RATE_FRACTION = 0.8
#: HeiSD's command-rate ratio vs AR agrees with its in-process speed ratio within this.
AGREE_TOLERANCE = 0.10
#: A stamp maps to the frame published with it when this close (ns; frames are 33 ms apart).
STAMP_TOLERANCE_NS = 1_000_000
#: Log format forced on the children, so held-step lines parse with their time.
LOG_FORMAT = "[{severity}] [{time}] [{name}]: {message}"
_HELD_RE = re.compile(r"\[(?P<t>\d+(?:\.\d+)?)\] \[[^\]]*\]: holding, no command: stale command"
                      r".*?decode took (?P<ms>\d+(?:\.\d+)?) ms")
_TIME_RE = re.compile(r"\[(?P<t>\d+(?:\.\d+)?)\] \[")
_FATAL_RE = re.compile(r"policy not configured|policy stopped")
SYNTHETIC_INSTRUCTION = "put the red block on the plate"
#: Robot state of the synthetic fallback: the emulated arm's start pose (flange, m / rad).
SYNTHETIC_POSE = (0.235, 0.0, 0.432, 0.0, 0.0, 0.0)
JOINT_NAMES = ("joint1", "joint2", "joint3", "joint4", "joint5", "joint6", "gripper")
#: ``--retrieval-fault`` choices (module docstring).
RETRIEVAL_FAULTS = ("none", "killed", "slow", "empty")
#: In-process figures of a method run under a retrieval fault.
FAULT_NA = "n/a (fault drill)"
#: HybridStep.draft_source numbers by name.
DRAFT_SOURCES = {2: "retrieval", 1: "drafter", 0: "none"}
#: Most common HybridStep statuses reported per method.
STATUS_TOP = 4
_DIGITS_RE = re.compile(r"\d+")


def dds_domain_id() -> int:
    """The private DDS domain of one run, held until this process ends.

    From ``heisd_ros.testing.domains``: a lock per id shared by every allocator on the
    machine, the tests and ``graph_age`` included.
    """
    from heisd_ros.testing.domains import allocate_domain

    return allocate_domain()


# ------------------------------------------------------------------ pure figures
def summary(values: Iterable[float]) -> dict | None:
    """n, p50, p99, mean and max of ``values``; None when there are none."""
    arr = np.asarray([float(v) for v in values], dtype=np.float64)
    if not arr.size:
        return None
    p50, p99 = np.percentile(arr, [50, 99])
    return {"n": int(arr.size), "p50": float(p50), "p99": float(p99),
            "mean": float(arr.mean()), "max": float(arr.max())}


def ratio(num: float | None, den: float | None) -> float | None:
    """``num / den``; None when either is unknown or ``den`` is not positive."""
    if num is None or den is None or not den > 0:
        return None
    return float(num) / float(den)


def agree(a: float | None, b: float | None, tolerance: float = AGREE_TOLERANCE) -> bool | None:
    """Whether ``a`` lies within ``tolerance`` (relative) of ``b``; None when either is unknown."""
    r = ratio(a, b)
    return None if r is None else abs(r - 1.0) <= tolerance


def stamp_ns(sec: int, nanosec: int) -> int:
    """A ``builtin_interfaces/Time`` as integer nanoseconds."""
    return int(sec) * 1_000_000_000 + int(nanosec)


def indices_of_stamps(published: Sequence[tuple[int, int]], stamps: Iterable[int],
                      tolerance_ns: int = STAMP_TOLERANCE_NS) -> list[int | None]:
    """The observation index of each stamp: that of the frame published nearest to it.

    Args:
        published: (stamp ns, observation index) of every frame pair sent, stamps ascending.
        stamps: stamps to look up, ns (the node's stamps went through float seconds).
        tolerance_ns: farther than this from every published stamp: None.
    """
    keys = [s for s, _ in published]
    out: list[int | None] = []
    for stamp in stamps:
        j = bisect.bisect_left(keys, stamp)
        best = min((k for k in (j - 1, j) if 0 <= k < len(keys)),
                   key=lambda k: abs(keys[k] - stamp), default=None)
        out.append(published[best][1] if best is not None
                   and abs(keys[best] - stamp) <= tolerance_ns else None)
    return out


def parse_held_decodes(lines: Iterable[str], start_s: float = -math.inf,
                       end_s: float = math.inf) -> list[float]:
    """Decode times (ms) of the policy's stale-command log lines logged in [start_s, end_s]."""
    out = []
    for line in lines:
        match = _HELD_RE.search(line)
        if match and start_s <= float(match["t"]) <= end_s:
            out.append(float(match["ms"]))
    return out


def count_log_lines(lines: Iterable[str], needle: str, start_s: float = -math.inf,
                    end_s: float = math.inf) -> int:
    """Log lines containing ``needle`` whose time (``[sec.nsec]``) lies in [start_s, end_s]."""
    n = 0
    for line in lines:
        match = _TIME_RE.search(line) if needle in line else None
        n += bool(match and start_s <= float(match["t"]) <= end_s)
    return n


def publish_gaps(times_s: Sequence[float], start_s: float, end_s: float) -> dict:
    """How regularly this process published: count, rate and largest gap in [start_s, end_s]."""
    inside = [t for t in times_s if start_s <= t <= end_s]
    span = end_s - start_s
    gaps = np.diff(inside) if len(inside) > 1 else np.zeros(0)
    return {"count": len(inside), "rate_hz": len(inside) / span if span > 0 else None,
            "max_gap_ms": float(gaps.max() * 1e3) if gaps.size else None}


def counter_deltas(before: dict, after: dict, prefix: str) -> dict[str, int]:
    """``after - before`` of the integer diagnostic values whose key starts with ``prefix``."""
    out = {}
    for key, value in after.items():
        if not key.startswith(prefix):
            continue
        try:
            out[key] = int(float(value)) - int(float(before.get(key, 0)))
        except (TypeError, ValueError):
            continue
    return out


def held_by_reason(before: dict, after: dict) -> dict[str, int]:
    """Held steps per refusal kind over the window (``refused[<kind>]`` deltas, non-zero)."""
    return {key[len("refused["):-1]: n for key, n in counter_deltas(before, after,
                                                                    "refused[").items() if n}


def normalise_status(status: str) -> str:
    """A HybridStep status with each run of digits replaced by ``N`` (timings then group)."""
    return _DIGITS_RE.sub("N", status.strip())


def status_counts(statuses: Iterable[str], top: int = STATUS_TOP) -> dict:
    """The ``top`` most common normalised statuses with their counts ("" = no status).

    Returns ``{"top": [[status, n], ...], "other": n of the rest, "distinct": k}``; ties go
    alphabetically.
    """
    counts = Counter(normalise_status(s) for s in statuses)
    common = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    return {"top": [[text, n] for text, n in common],
            "other": sum(counts.values()) - sum(n for _, n in common), "distinct": len(counts)}


def step_sources(statuses: Sequence[str], draft_sources: Sequence[int],
                 verify_skipped: Sequence[bool]) -> dict:
    """Per-step HybridStep figures: status counts, draft-source shares, verify-skip share."""
    n = len(draft_sources)
    return {"steps": len(statuses), "status": status_counts(statuses),
            "draft_source_share": {name: (sum(int(s) == code for s in draft_sources) / n
                                          if n else None)
                                   for code, name in DRAFT_SOURCES.items()},
            "verify_skipped_share": _share(verify_skipped)}


def _share(flags: Sequence[bool]) -> float | None:
    return sum(map(bool, flags)) / len(flags) if flags else None


def finite_float(values: dict, key: str) -> float | None:
    """``values[key]`` as a finite float; None when missing, not a number or not finite."""
    try:
        value = float(values[key])
    except (KeyError, TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def node_wall_time(held_ms: Sequence[float], sent: int, policy_diag: dict,
                   policy_before: dict | None = None) -> dict | None:
    """The node's wall-clock step time (p50, p99) and where it came from (module docstring).

    From the diagnostics, ``before_window`` is how many of the steps they cover were decoded
    before the window (``decoded_steps`` when it started; the node keeps its newest ones).
    """
    held = summary(held_ms)
    p50 = finite_float(policy_diag, "decode_p50_ms")
    p99 = finite_float(policy_diag, "decode_p99_ms")
    if sent == 0 and held:
        return {**held, "source": "log: every decoded step of the window (all held stale)"}
    if p50 is not None and p99 is not None:
        n = finite_float(policy_diag, "decoded_steps")
        n0 = finite_float(policy_before or {}, "decoded_steps") or 0.0
        in_window = sent + len(held_ms)
        before = max(0, min(int(n0), int(n or 0) - in_window)) if n is not None else None
        return {"n": n, "p50": p50, "p99": p99, "before_window": before,
                "source": "diagnostics decode_p50_ms/decode_p99_ms: the node's last decoded "
                          "steps, sent and held (before_window of them precede the window)"}
    if held:
        return {**held, "source": "log: held steps only (sent steps have no wall-clock time "
                                  "without the node's decode_p50_ms diagnostics)"}
    return None


def frame_clock_rate_hz(step_ms: Sequence[float], camera_hz: float) -> float | None:
    """Commands/s of these step times, in order, when a step may start only on a new frame.

    The node's loop: a step starts at once when a frame newer than the last one used has
    arrived, else at the next frame; frames come every 1/camera_hz. A decoder slower than the
    frame period runs back to back (1/step time); a faster one is held to the camera rate.
    """
    if not step_ms or camera_hz <= 0:
        return None
    period_s, start_s = 1.0 / camera_hz, 0.0
    for ms in step_ms:
        frame_s = math.floor(start_s / period_s + 1e-9) * period_s  # the frame it decides on
        start_s = max(start_s + ms / 1e3, frame_s + period_s)
    return len(step_ms) / start_s


#: HybridStep stage fields whose medians the report compares, node vs in-process.
STAGES = ("vision_ms", "retrieval_ms", "prefill_ms", "draft_ms", "verify_ms", "overhead_ms",
          "total_ms")


def stage_medians(rows: Sequence[dict]) -> dict[str, float] | None:
    """Median of each of :data:`STAGES` over per-step dicts (None without steps)."""
    if not rows:
        return None
    return {k: float(np.median([r.get(k, math.nan) for r in rows])) for k in STAGES}


def method_report(phase: dict, inprocess: dict, policy_limit_s: float,
                  driver_limit_s: float | None) -> dict:
    """The figures of one method from its graph phase and its in-process phase.

    ``phase``: ``duration_s``, ``ages_s`` (per command), ``hybrid_total_ms`` (per sent step),
    ``held_ms`` (logged decode times), ``policy_before``/``policy_after`` and
    ``driver_before``/``driver_after`` (diagnostic values). ``inprocess``: ``wall_ms`` and
    ``total_ms`` per decode (may be empty).
    """
    duration = float(phase["duration_s"])
    ages_ms = [a * 1e3 for a in phase.get("ages_s", [])]
    sent = len(phase.get("hybrid_total_ms", []))
    policy_after = phase.get("policy_after") or {}
    node_wall = node_wall_time(phase.get("held_ms", []), sent, policy_after,
                               phase.get("policy_before"))
    inproc = summary(inprocess.get("wall_ms", []))
    inproc_total = summary(inprocess.get("total_ms", []))
    node_total = summary(phase.get("hybrid_total_ms", []))
    rate = len(ages_ms) / duration if duration > 0 else None
    required = (RATE_FRACTION / (inproc["mean"] / 1e3)) if inproc and inproc["mean"] > 0 \
        else None
    camera_hz = float(phase.get("camera_hz") or 0.0)
    clock_rate = frame_clock_rate_hz(inprocess.get("wall_ms", []), camera_hz)
    required_clock = RATE_FRACTION * clock_rate if clock_rate else None
    driver_after = phase.get("driver_after") or {}
    return {
        "node_wall_ms": node_wall,
        "node_held_log_ms": summary(phase.get("held_ms", [])),
        "node_diagnostics_ms": {k: finite_float(policy_after, k) for k in
                                ("decode_p50_ms", "decode_p99_ms", "decoded_steps",
                                 "held_stale_share")} if "decode_p50_ms" in policy_after
        else None,
        "node_hybrid_total_ms": node_total,
        "inprocess_wall_ms": inproc,
        "inprocess_total_ms": inproc_total,
        "ratio_p50": ratio(node_wall and node_wall["p50"], inproc and inproc["p50"]),
        "ratio_p99": ratio(node_wall and node_wall["p99"], inproc and inproc["p99"]),
        "total_ratio_p50": ratio(node_total and node_total["p50"],
                                 inproc_total and inproc_total["p50"]),
        "total_ratio_p99": ratio(node_total and node_total["p99"],
                                 inproc_total and inproc_total["p99"]),
        "node_steps": {"sent": sent, "held_stale_logged": len(phase.get("held_ms", []))},
        "commands": len(ages_ms),
        "command_rate_hz": rate,
        "required_rate_hz": required,
        "rate_pass": None if rate is None or required is None else rate >= required,
        "inprocess_frame_clock_rate_hz": clock_rate,
        "required_frame_clock_rate_hz": required_clock,
        "rate_pass_frame_clock": None if rate is None or required_clock is None
        else rate >= required_clock,
        "stage_ms_p50": {"node": stage_medians(phase.get("hybrid_stages", [])),
                         "inprocess": stage_medians(inprocess.get("stages", []))},
        "age_ms": summary(ages_ms),
        "policy_max_command_age_s": policy_limit_s,
        "driver_max_command_age_s": driver_limit_s,
        "over_policy_limit": sum(a > policy_limit_s * 1e3 for a in ages_ms),
        "over_driver_limit": None if driver_limit_s is None
        else sum(a > driver_limit_s * 1e3 for a in ages_ms),
        "held_by_reason": held_by_reason(phase.get("policy_before") or {}, policy_after),
        "driver_commands": counter_deltas(phase.get("driver_before") or {}, driver_after,
                                          "commands_"),
        "driver_last_rejected_reason": driver_after.get("last_rejected_reason", ""),
        "driver_status": driver_after.get("status", ""),
        "driver_watchdog_holds": phase.get("driver_watchdog_holds"),
        "verify_skip_share": {"node": _share(phase.get("hybrid_verify_skipped", [])),
                              "inprocess": _share(inprocess.get("verify_skipped", []))},
        "hybrid_steps": step_sources(phase.get("hybrid_status", []),
                                     phase.get("hybrid_draft_source", []),
                                     phase.get("hybrid_verify_skipped", [])),
        "checks_behind": behind_counts(phase.get("hybrid_behind", [])),
        "retrieval_fault": phase.get("retrieval_fault"),
        "bench_frames": phase.get("bench_frames"),
        "bench_states": phase.get("bench_states"),
    }


def behind_counts(behind: Sequence[tuple[int, float]]) -> dict | None:
    """Checks behind collected by the sent steps (``heisd_behind``): verdicts and waits.

    ``behind``: per step (``HybridStep.behind_result``, ``behind_wait_ms``); None when no
    step collected one.
    """
    collected = [(r, w) for r, w in behind if r]
    if not collected:
        return None
    waits = [w for _, w in collected if w > 0.1]
    return {"collected": len(collected),
            "rejected": sum(r == BEHIND_REJECTED for r, _ in collected),
            "waited": len(waits), "wait_ms_p50": float(np.median(waits)) if waits else 0.0}


def heisd_vs_ar(reports: dict[str, dict], method: str = "heisd") -> dict | None:
    """HeiSD's command-rate ratio vs AR next to its in-process speed ratio; None without both."""
    if method not in reports or "ar" not in reports:
        return None
    ours, ar = reports[method], reports["ar"]
    rate_ratio = ratio(ours["command_rate_hz"], ar["command_rate_hz"]) \
        if ar["command_rate_hz"] else None
    speed = ratio(ar["inprocess_wall_ms"] and ar["inprocess_wall_ms"]["mean"],
                  ours["inprocess_wall_ms"] and ours["inprocess_wall_ms"]["mean"])
    clock = ratio(ours.get("inprocess_frame_clock_rate_hz"),
                  ar.get("inprocess_frame_clock_rate_hz"))
    return {"method": method, "command_rate_ratio": rate_ratio,
            "inprocess_speed_ratio": speed, "agree_within": AGREE_TOLERANCE,
            "agree": agree(rate_ratio, speed),
            "inprocess_frame_clock_ratio": clock,
            "agree_frame_clock": agree(rate_ratio, clock)}


def rate_vs_drafter(reports: dict[str, dict]) -> dict[str, float | None]:
    """Each faulted method's command rate / the drafter method's (None without both)."""
    drafter = reports.get("drafter") or {}
    return {name: ratio(r.get("command_rate_hz"), drafter.get("command_rate_hz"))
            for name, r in reports.items() if r.get("retrieval_fault") and not r.get("error")}


# ------------------------------------------------------------------ Markdown
def _f(value, fmt: str = ".0f") -> str:
    return "n/a" if value is None else format(value, fmt)


def _pair(s: dict | None, fmt: str = ".0f") -> str:
    return "n/a" if not s else f"{s['p50']:{fmt}} / {s['p99']:{fmt}}"


_SOURCE_TAGS = {"log: every": "log", "diagnostics": "diag", "log: held": "log-held"}


def _source_tag(node_wall: dict | None) -> str:
    if not node_wall:
        return "-"
    tag = next((tag for prefix, tag in _SOURCE_TAGS.items()
                if node_wall["source"].startswith(prefix)), "?")
    if node_wall.get("before_window"):
        tag += f" ({node_wall['before_window']} of {node_wall['n']:.0f} before)"
    return tag


def format_markdown(result: dict) -> str:
    """The run's Markdown: step times, commands at the driver, HeiSD vs AR, sources."""
    setup = result["setup"]
    lines = [f"## heisd-bench graph ({setup['date']})", "",
             f"{setup['duration_s']:g} s per method after the policy was ready; cameras "
             f"{setup['camera_hz']:g} Hz ({setup['image']}), robot state {setup['state_hz']:g} "
             f"Hz; observations: {setup['observations']}; DDS domain {setup['domain']}; "
             f"policy `model.threads` {setup['threads']}; policy parameters: shipped"
             + "".join(f", {k}={v}" for k, v in (setup.get("policy_param") or {}).items())
             + ".", "",
             "### Step time, ms: node vs in-process", "",
             "| method | node wall p50 / p99 | src | in-process p50 / p99 | in-process mean "
             "| ratio p50 / p99 | node total_ms p50 / p99 (sent) | in-process total_ms "
             "p50 / p99 | total_ms ratio p50 / p99 | steps node sent+held / in-process |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in result["methods"].items():
        if r.get("error"):
            lines.append(f"| {name} | failed: {r['error']} |" + " |" * 8)
            continue
        inproc = r["inprocess_wall_ms"]
        steps = r["node_steps"]
        sent_held = f"{steps['sent']}+{steps['held_stale_logged']}"
        if r.get("retrieval_fault"):
            lines.append(
                f"| {name} (fault: {r['retrieval_fault']['mode']}) | {_pair(r['node_wall_ms'])} "
                f"| {_source_tag(r['node_wall_ms'])} | {FAULT_NA} | {FAULT_NA} | {FAULT_NA} | "
                f"{_pair(r['node_hybrid_total_ms'])} | {FAULT_NA} | {FAULT_NA} | {sent_held} / "
                f"{FAULT_NA} |")
            continue
        lines.append(
            f"| {name} | {_pair(r['node_wall_ms'])} | {_source_tag(r['node_wall_ms'])} | "
            f"{_pair(inproc)} | {_f(inproc and inproc['mean'])} | {_f(r['ratio_p50'], '.2f')} "
            f"/ {_f(r['ratio_p99'], '.2f')} | {_pair(r['node_hybrid_total_ms'])} | "
            f"{_pair(r['inprocess_total_ms'])} | {_f(r['total_ratio_p50'], '.2f')} / "
            f"{_f(r['total_ratio_p99'], '.2f')} | {sent_held} / {inproc['n'] if inproc else 0} |")
    lines += ["", "### Commands at the driver", "",
              "| method | commands | rate /s | needed (0.8/mean) | pass | needed at the frame "
              "clock (0.8 x in-process rate at the camera rate) | pass | age p50 / p99 / max ms "
              "| > driver limit | > policy limit | driver received/executed/rejected | "
              "driver watchdog holds | held by reason |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in result["methods"].items():
        if r.get("error"):
            continue
        age = r["age_ms"]
        ages = "n/a" if not age else f"{age['p50']:.0f} / {age['p99']:.0f} / {age['max']:.0f}"
        d = r["driver_commands"]
        held = ", ".join(f"{k}: {n}" for k, n in sorted(r["held_by_reason"].items())) or "-"
        passed = {None: "n/a", True: "pass", False: "FAIL"}[r["rate_pass"]]
        needed = _f(r['required_rate_hz'], '.2f')
        passed_clock = {None: "n/a", True: "pass", False: "FAIL"}[
            r.get("rate_pass_frame_clock")]
        needed_clock = _f(r.get("required_frame_clock_rate_hz"), ".2f")
        if r.get("retrieval_fault"):
            needed = passed = needed_clock = passed_clock = FAULT_NA
        lines.append(
            f"| {name} | {r['commands']} | {_f(r['command_rate_hz'], '.2f')} | "
            f"{needed} | {passed} | {needed_clock} | {passed_clock} | {ages} | "
            f"{r['over_driver_limit']} (> {_f(r['driver_max_command_age_s'], 'g')} s) | "
            f"{r['over_policy_limit']} (> {r['policy_max_command_age_s']:g} s) | "
            f"{d.get('commands_received', 'n/a')}/{d.get('commands_executed', 'n/a')}/"
            f"{d.get('commands_rejected', 'n/a')} | {_f(r.get('driver_watchdog_holds'), 'd')} "
            f"| {held} |")
    lines += format_status_table(result)
    lines += ["", "### Median stage times, ms: node (HybridStep) / in-process", "",
              "| method | " + " | ".join(k[:-3] for k in STAGES) + " |",
              "| --- |" + " --- |" * len(STAGES)]
    for name, r in result["methods"].items():
        st = r.get("stage_ms_p50") or {}
        node, inproc = st.get("node") or {}, st.get("inprocess") or {}
        if node or inproc:
            lines.append(f"| {name} | " + " | ".join(
                f"{_f(node.get(k), '.1f')} / {_f(inproc.get(k), '.1f')}" for k in STAGES) + " |")
    cmp_ = result.get("heisd_vs_ar")
    if cmp_:
        verdict = {None: "n/a", True: "yes", False: "no"}
        lines += ["", "### HeiSD vs AR", "",
                  "| command-rate ratio heisd/ar | in-process speed ratio (AR mean / HeiSD "
                  "mean) | agree within 10% | in-process ratio at the frame clock | agree "
                  "within 10% |", "| --- | --- | --- | --- | --- |",
                  f"| {_f(cmp_['command_rate_ratio'], '.2f')} | "
                  f"{_f(cmp_['inprocess_speed_ratio'], '.2f')} | {verdict[cmp_['agree']]} | "
                  f"{_f(cmp_.get('inprocess_frame_clock_ratio'), '.2f')} | "
                  f"{verdict[cmp_.get('agree_frame_clock')]} |"]
    lines += ["", "Sources: node wall `log` = the policy log's held steps (\"decode took N ms\", "
              "every decoded step when none was sent); `diag` = the policy's /diagnostics "
              "decode_p50_ms/decode_p99_ms (last decoded steps, sent and held, may include "
              "steps before the window); `log-held` = held steps only. node total_ms = "
              "HybridStep.total_ms of the steps sent (the decoder's own timing). In-process = "
              "perf_counter around decode() on the node's observations in its order (and the "
              "decoder's total_ms). Ratios = node / in-process. Command age = arrival here - "
              "header.stamp; held by reason = change of refused[<kind>] on /diagnostics; "
              "driver counts = change of commands_* on its /diagnostics."]
    for name, r in result["methods"].items():
        frames, states = r.get("bench_frames") or {}, r.get("bench_states") or {}
        played = (f"played {_f(frames.get('rate_hz'), '.1f')} frame pairs/s (largest gap "
                  f"{_f(frames.get('max_gap_ms'))} ms), {_f(states.get('rate_hz'), '.0f')} "
                  f"robot states/s (largest gap {_f(states.get('max_gap_ms'))} ms)"
                  if frames else None)
        skip = r.get("verify_skip_share") or {}
        skips = (f"verify-skipped steps: node {_f(skip['node'], '.0%')}, in-process "
                 f"{_f(skip['inprocess'], '.0%')}" if skip.get("node") or skip.get("inprocess")
                 else None)
        load = r.get("load_avg_1min")
        loads = (f"1-min load average {load['graph_end']:.1f} at the graph's end"
                 + (f", {load['inprocess_end']:.1f} at the in-process phase's end"
                    if load.get("inprocess_end") is not None else "") if load else None)
        status = r.get("driver_status")
        status = f"driver controller {status} at the end" if status not in (None, "",
                                                                            "running") else None
        killed = (r.get("retrieval_fault") or {}).get("killed")
        notes = [n for n in (r.get("inprocess_order"), killed, played, skips, loads, status,
                             r.get("died"),
                             r.get("driver_last_rejected_reason")
                             and f"driver's last rejection: {r['driver_last_rejected_reason']}")
                 if n]
        if notes:
            lines.append(f"- {name}: " + "; ".join(str(n) for n in notes))
    return "\n".join(lines) + "\n"


def _status_cell(status: dict) -> str:
    parts = [f"{(text or '(no status)').replace('|', '/')}: {n}" for text, n in status["top"]]
    if status["other"]:
        parts.append(f"{status['distinct'] - len(status['top'])} others: {status['other']}")
    return "; ".join(parts) or "-"


def format_status_table(result: dict) -> list[str]:
    """Markdown lines of the table "HybridStep status by method" (and the fault drill)."""
    fault = (result.get("setup") or {}).get("retrieval_fault") or "none"
    vs_drafter = rate_vs_drafter(result["methods"])
    lines = ["", "### HybridStep status by method", ""]
    if fault != "none":
        lines += [f"Retrieval fault drill: `{fault}` for the methods that use retrieval "
                  f"(their in-process phase skipped).", ""]
    lines += ["| method | fault | steps sent | draft source retrieval / drafter / none | "
              "verify-skipped | commands /s (vs drafter) | status: the 4 most common "
              "(digits as N) |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in result["methods"].items():
        steps = r.get("hybrid_steps")
        if r.get("error") or not steps:
            continue
        share = steps["draft_source_share"]
        shares = " / ".join(_f(share[k], ".0%") for k in ("retrieval", "drafter", "none"))
        faulted = r.get("retrieval_fault")
        rate = _f(r["command_rate_hz"], ".2f")
        if name in vs_drafter:
            rate += f" ({_f(vs_drafter[name], '.2f')})"
        lines.append(f"| {name} | {faulted['how'] if faulted else '-'} | {steps['steps']} | "
                     f"{shares} | {_f(steps['verify_skipped_share'], '.0%')} | {rate} | "
                     f"{_status_cell(steps['status'])} |")
    behind = {n: r["checks_behind"] for n, r in result["methods"].items()
              if r.get("checks_behind")}
    for name, c in behind.items():
        lines += ["", f"Checks behind ({name}): {c['collected']} collected by the sent steps, "
                      f"{c['rejected']} rejected (the next step verified); the step waited for "
                      f"{c['waited']} of them (median {c['wait_ms_p50']:.1f} ms)."]
    return lines


# ------------------------------------------------------------------ the replay
@dataclass
class Replay:
    """Observations to play, one per camera frame, looped.

    Attributes:
        third, wrist: per observation (S, S, 3) uint8 RGB as published.
        states: (N, 13) joints (6, rad), gripper width (m), EE position (3, m), rpy (3, rad).
        episode: (N,) which replayed episode each observation belongs to.
        instruction, task: what the policy is told ("" task: the instruction is the key).
        description, image_note: for the report.
    """

    third: list = field(default_factory=list)
    wrist: list = field(default_factory=list)
    states: np.ndarray | None = None
    episode: np.ndarray | None = None
    instruction: str = SYNTHETIC_INSTRUCTION
    task: str = ""
    description: str = ""
    image_note: str = ""

    def __len__(self) -> int:
        return len(self.third)


def _resize(rgb: np.ndarray, px: int) -> np.ndarray:
    if px <= 0 or rgb.shape[:2] == (px, px):
        return np.ascontiguousarray(rgb)
    from PIL import Image as PILImage

    return np.array(PILImage.fromarray(rgb).resize((px, px), PILImage.BILINEAR))


def load_replay(args) -> Replay:
    """The demonstrations of ``--db`` (or ``--demos``), else seeded synthetic scenes."""
    replay, rows, episodes, sizes = Replay(), [], [], set()

    def add(obs, ep: int, proprio=None) -> None:
        sizes.add(obs.image_primary.shape[:2])
        replay.third.append(_resize(obs.image_primary, args.image_px))
        replay.wrist.append(_resize(obs.image_wrist, args.image_px))
        joints = obs.extras.get("joint_positions_rad", np.zeros(6))
        p = obs.proprio if proprio is None else proprio
        rows.append(np.concatenate([joints, [p[6]], p[:3], p[3:6]]))
        episodes.append(ep)

    if args.db:
        from heisd_ros.data.npz_episodes import iter_episode_paths
        from heisd_ros.tools._common import episode_loader, recorded_episodes

        offline = json.loads((Path(args.db) / "offline_stats.json").read_text(encoding="utf-8"))
        key = "held_out_episodes" if offline.get("held_out_episodes") else "db_episodes"
        paths = (iter_episode_paths(args.demos) if args.demos
                 else recorded_episodes(offline, key, "--demos"))
        load = episode_loader(offline)
        used = 0
        for path in paths:
            record = load(path)
            replay.task = replay.task or args.task or record.task
            if record.task != replay.task:
                continue
            replay.instruction = record.instruction
            for t in range(record.num_steps):
                add(record.observation(t), used)
                if len(replay) >= args.observations:
                    break
            used += 1
            if len(replay) >= args.observations:
                break
        if not len(replay):
            raise ValueError(f"no demonstration of task {replay.task!r} in "
                             f"{args.demos or key + ' of ' + args.db}")
        replay.description = (f"{len(replay)} observations of {used} demonstrations of task "
                              f"{replay.task!r} ({args.demos or key} of {args.db})")
    else:
        from heisd_ros.models.synthetic_scenes import SyntheticScenes

        proprio = np.asarray([*SYNTHETIC_POSE, 0.07], np.float32)
        for obs in SyntheticScenes(args.observations, seed=args.seed):
            add(obs, 0, proprio)
        replay.description = (f"{len(replay)} synthetic scenes (seed {args.seed}), instruction "
                              f"{SYNTHETIC_INSTRUCTION!r}, constant robot state")
    replay.states, replay.episode = np.asarray(rows, np.float64), np.asarray(episodes)
    recorded = ", ".join(f"{h}x{w}" for h, w in sorted(sizes))
    replay.image_note = (f"{recorded} px as recorded" if args.image_px <= 0
                         else f"{args.image_px}x{args.image_px} px, resized from {recorded}")
    return replay


def state_messages(state: np.ndarray, frame_id: str = "base_link"):
    """(JointState, PoseStamped) of one replay state row, headers without stamp."""
    from geometry_msgs.msg import PoseStamped
    from sensor_msgs.msg import JointState

    from heisd_ros.nodes.robot_msgs import rpy_to_quaternion

    joint = JointState(name=list(JOINT_NAMES), position=[float(v) for v in state[:7]])
    pose = PoseStamped()
    pose.header.frame_id = frame_id
    p, o = pose.pose.position, pose.pose.orientation
    p.x, p.y, p.z = (float(v) for v in state[7:10])
    o.x, o.y, o.z, o.w = rpy_to_quaternion(state[10:13])
    return joint, pose


# ------------------------------------------------------------------ processes
class Children:
    """The graph's processes: started with logs, stopped in order, their deaths named."""

    def __init__(self, tmp: Path, env: dict) -> None:
        self.tmp, self.env = tmp, env
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}

    def start(self, name: str, module: str, params: Path | None, extra: Sequence[str] = (),
              program_args: Sequence[str] = ()) -> None:
        """Start ``python -m module [program_args]`` with ``params`` (ROS arguments).

        Output goes to ``<tmp>/<name>.log``.
        """
        self.logs[name] = self.tmp / f"{name}.log"
        ros_args = ["--params-file", str(params)] if params is not None else []
        with open(self.logs[name], "w") as log:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", module, *program_args, "--ros-args", *ros_args,
                 *extra], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.env, cwd=self.tmp, start_new_session=True)

    def kill(self, name: str) -> str:
        """SIGKILL one child on purpose (no longer watched or stopped); what happened."""
        from heisd_ros.nodes.graph import exit_description

        proc = self.procs.pop(name)
        if proc.poll() is not None:
            return f"{name} had already {exit_description(proc.returncode)}"
        proc.kill()
        proc.wait()
        return f"{name} (pid {proc.pid}) SIGKILLed: {exit_description(proc.returncode)}"

    def dead(self) -> list[str]:
        """Children that exited, as "name exited with code N"."""
        from heisd_ros.nodes.graph import exit_description

        return [f"{name} {exit_description(p.returncode)}" for name, p in self.procs.items()
                if p.poll() is not None]

    def tail(self, name: str, lines: int = 20) -> str:
        """The last ``lines`` of a child's log."""
        try:
            text = self.logs[name].read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGINT to each (policy first, the driver or sim last), then SIGKILL after a timeout."""
        for name in sorted(self.procs, key=lambda n: ("policy", "retrieval", "driver",
                                                      "sim").index(n.split("_")[0])):
            proc = self.procs.pop(name)
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def ros_parameters(path: Path) -> dict:
    """The parameters of a params file written by ``graph.write_params_file``."""
    return yaml.safe_load(path.read_text())["/**"]["ros__parameters"]


def policy_overrides(items: Sequence[str] | None) -> dict:
    """``KEY=VALUE`` texts as parameter overrides (values read as YAML: 0.4, false, text)."""
    out = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--policy-param: expected KEY=VALUE, got {item!r}")
        out[key.strip()] = yaml.safe_load(value) if value.strip() else ""
    return out


def write_phase_params(method: str, args, replay: Replay, tmp: Path) -> dict[str, Path]:
    """The params files of one phase (shipped YAMLs with the bench's few overrides)."""
    from heisd_ros.decoding.methods import METHODS
    from heisd_ros.nodes.graph import write_params_file

    policy = {"method": method, "instruction": replay.instruction, "task": replay.task,
              "warn_throttle_s": 0.0,
              "model.path": str(ASSETS / "small_vla.safetensors"),
              "model.drafter_path": str(ASSETS / "draft_head.safetensors")}
    files = {}
    if METHODS[method].hybrid:
        db = Path(args.db).resolve()
        policy["model.db_dir"] = str(db)
        if (db / "calibration.json").is_file():
            policy["model.calibration_path"] = str(db / "calibration.json")
        files["retrieval"] = write_params_file(tmp / f"retrieval_{method}.yaml",
                                               "retrieval_node", {"store.path": str(db)})
    policy.update(policy_overrides(args.policy_param))
    files["policy"] = write_params_file(tmp / f"policy_{method}.yaml", "policy_node", policy)
    files["driver"] = write_params_file(tmp / f"driver_{method}.yaml", "piper_driver_node", {
        "emulate": True, "interface": "virtual", "enable_on_start": True})
    return files


# ------------------------------------------------------------------ the graph phase
def run_graph_phase(method: str, args, replay: Replay, files: dict[str, Path], tmp: Path,
                    env: dict, context, children: Children) -> dict:
    """Start the graph, play the inputs, measure ``--duration-s``; return the raw figures."""
    from diagnostic_msgs.msg import DiagnosticArray
    from geometry_msgs.msg import PoseStamped
    from rclpy.executors import SingleThreadedExecutor
    from sensor_msgs.msg import Image, JointState

    from heisd_ros.msg import EECommand, HybridStep
    from heisd_ros.nodes.image_conversion import rgb_to_image
    from heisd_ros.nodes.robot_msgs import stamp_to_seconds

    phase_dir = tmp / method
    phase_dir.mkdir(exist_ok=True)
    children.tmp = phase_dir
    children.start("driver", "heisd_ros.nodes.piper_driver_node", files["driver"],
                   ["-r", "/joint_states:=/driver/joint_states",
                    "-r", "/ee_pose:=/driver/ee_pose"])
    fault = phase_fault(method, args, files)
    if fault and fault["mode"] in ("slow", "empty"):
        children.start("retrieval_fault", "heisd_ros.nodes.retrieval_fault", None,
                       program_args=["--mode", fault["mode"],
                                     "--delay-s", f"{args.fault_delay_s:g}"])
    elif "retrieval" in files:
        children.start("retrieval", "heisd_ros.nodes.retrieval_node", files["retrieval"])
    children.start("policy", "heisd_ros.nodes.policy_node", files["policy"])

    node = rclpy_node(context, f"heisd_graph_bench_{method}")
    clock = node.get_clock()
    ages_s: list[float] = []
    # (stamp ns, total_ms, verify_skipped, status, draft_source) per step sent in the window
    steps: list[tuple[int, float, bool, str, int]] = []
    diagnostics: dict[str, dict[str, str]] = {}
    published: list[tuple[int, int]] = []  # (stamp ns, observation index)
    state_times: list[float] = []  # when each robot state went out, s
    state = {"frame": 0, "index": 0, "measuring": False, "commands_seen": 0}

    def now_s() -> float:
        return clock.now().nanoseconds * 1e-9

    def on_command(msg: EECommand) -> None:
        t = now_s()
        state["commands_seen"] += 1
        if state["measuring"]:
            ages_s.append(t - (msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9))

    def on_step(msg: HybridStep) -> None:
        if state["measuring"]:
            steps.append((stamp_ns(msg.header.stamp.sec, msg.header.stamp.nanosec),
                          float(msg.total_ms), bool(msg.verify_skipped), str(msg.status),
                          int(msg.draft_source),
                          {k: float(getattr(msg, k)) for k in STAGES},
                          (int(msg.behind_result), float(msg.behind_wait_ms))))

    def on_diag(msg: DiagnosticArray) -> None:
        for status in msg.status:
            diagnostics[status.name] = {kv.key: kv.value for kv in status.values}
            diagnostics[status.name]["message"] = status.message

    cams = [node.create_publisher(Image, topic, 2) for topic in
            ("/camera/third_person/image_raw", "/camera/wrist/image_raw")]
    joint_pub = node.create_publisher(JointState, "/joint_states", 10)
    pose_pub = node.create_publisher(PoseStamped, "/ee_pose", 10)
    state_msgs = [state_messages(s) for s in replay.states]

    def publish_frames() -> None:
        index = state["frame"] % len(replay)
        state["frame"] += 1
        state["index"] = index
        stamp = clock.now().to_msg()
        published.append((stamp_ns(stamp.sec, stamp.nanosec), index))
        for pub, rgb in zip(cams, (replay.third[index], replay.wrist[index]), strict=True):
            msg = rgb_to_image(rgb)
            msg.header.stamp, msg.header.frame_id = stamp, "base_link"
            pub.publish(msg)

    def publish_state() -> None:
        joint, pose = state_msgs[state["index"]]
        joint.header.stamp = pose.header.stamp = clock.now().to_msg()
        state_times.append(stamp_to_seconds(joint.header.stamp))
        joint_pub.publish(joint)
        pose_pub.publish(pose)

    node.create_subscription(EECommand, "/heisd/ee_command", on_command, 100)
    node.create_subscription(HybridStep, "/heisd/hybrid_step", on_step, 100)
    node.create_subscription(DiagnosticArray, "/diagnostics", on_diag, 50)
    node.create_timer(1.0 / args.camera_hz, publish_frames)
    node.create_timer(1.0 / args.state_hz, publish_state)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    policy_log = children.logs["policy"]
    result = {"method": method, "duration_s": args.duration_s, "logs": {
        k: str(v) for k, v in children.logs.items()}, "error": None, "died": None,
        "retrieval_fault": fault}
    try:
        print(f"[graph] {method}: waiting for the policy (first command or held step; at most "
              f"{args.ready_timeout_s:g} s); logs in {phase_dir}", flush=True)
        t_start, next_check = time.monotonic(), 0.0
        ready = False
        while time.monotonic() - t_start < args.ready_timeout_s:
            executor.spin_once(timeout_sec=0.05)
            if state["commands_seen"]:
                ready = True
                break
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + 0.5
                text = policy_log.read_text(errors="replace")
                if parse_held_decodes(text.splitlines()):
                    ready = True
                    break
                fatal = _FATAL_RE.search(text)
                if fatal or children.dead():
                    result["error"] = ("; ".join(children.dead())
                                       or f"policy: {fatal.group(0)}")
                    break
        result["ready_after_s"] = time.monotonic() - t_start
        if not ready:
            result["error"] = result["error"] or (f"not ready within "
                                                  f"{args.ready_timeout_s:g} s")
            return result
        _spin_for(executor, 1.5)  # a fresh diagnostics sample of every node
        before = {k: dict(v) for k, v in diagnostics.items()}
        if fault and fault["mode"] == "killed":
            fault["killed"] = children.kill("retrieval")
            print(f"[graph] {method}: fault drill: {fault['killed']}", flush=True)
        state["measuring"] = True
        t0 = now_s()
        start_index = state["index"]
        end = time.monotonic() + args.duration_s
        while time.monotonic() < end:
            executor.spin_once(timeout_sec=0.05)
            if children.dead():
                result["died"] = "; ".join(children.dead())
                break
        state["measuring"] = False
        t1 = now_s()
        after = {k: dict(v) for k, v in diagnostics.items()}
    finally:
        executor.shutdown()
        node.destroy_node()
    lines = policy_log.read_text(errors="replace").splitlines()
    driver_lines = children.logs["driver"].read_text(errors="replace").splitlines()
    policy_name, driver_name = "policy_node: policy", "piper_driver_node: controller"
    result.update({
        "duration_s": t1 - t0, "window": [t0, t1], "start_index": start_index,
        "ages_s": ages_s, "hybrid_total_ms": [s[1] for s in steps],
        "hybrid_stamps_ns": [s[0] for s in steps],
        "hybrid_verify_skipped": [s[2] for s in steps],
        "hybrid_status": [s[3] for s in steps],
        "hybrid_draft_source": [s[4] for s in steps],
        "hybrid_stages": [s[5] for s in steps], "camera_hz": args.camera_hz,
        "hybrid_behind": [s[6] for s in steps],
        "hybrid_indices": indices_of_stamps(published, [s[0] for s in steps]),
        "held_ms": parse_held_decodes(lines, t0, t1),
        "frames_published": len(published),
        "bench_frames": publish_gaps([s * 1e-9 for s, _ in published], t0, t1),
        "bench_states": publish_gaps(state_times, t0, t1),
        "driver_watchdog_holds": count_log_lines(driver_lines, "controller watchdog_hold", t0,
                                                 t1),
        "policy_before": before.get(policy_name, {}), "policy_after": after.get(policy_name, {}),
        "driver_before": before.get(driver_name, {}), "driver_after": after.get(driver_name, {}),
        "diagnostics": after})
    return result


def phase_fault(method: str, args, files: dict[str, Path]) -> dict | None:
    """The retrieval fault of one method's phase: None for none or a method without retrieval.

    ``{"mode": ..., "how": what is done, for the report}``.
    """
    mode = getattr(args, "retrieval_fault", "none") or "none"
    if mode == "none" or "retrieval" not in files:
        return None
    how = {"killed": "retrieval node SIGKILLed at the window's start",
           "slow": f"retrieval_fault: answers after {getattr(args, 'fault_delay_s', 0.5):g} s",
           "empty": "retrieval_fault: answers at once, no candidates"}[mode]
    return {"mode": mode, "how": how}


def _spin_for(executor, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        executor.spin_once(timeout_sec=0.05)


def rclpy_node(context, name: str):
    """A node of the bench's context."""
    import rclpy

    return rclpy.create_node(name, context=context)


# ------------------------------------------------------------------ the in-process phase
class InProcess:
    """The policy's decoder in this process, on the replay's observations."""

    def __init__(self) -> None:
        self._targets: dict[tuple, tuple] = {}

    def run(self, method: str, model: dict, store: dict | None, replay: Replay,
            order: list[int], advance: bool, warmup: int) -> dict:
        """Decode ``order``'s observations; per decode the wall-clock and total_ms.

        ``advance``: the episode state advances after each decode (the node sent them).
        """
        from dataclasses import asdict

        from heisd_ros.data.episode import make_proprio
        from heisd_ros.data.observation import EpisodeState, Observation
        from heisd_ros.nodes.policy_decoders import ModelConfig, build_decoder, load_target
        from heisd_ros.nodes.policy_decoders import warm_up as warm_target
        from heisd_ros.nodes.robot_msgs import pose_from_msg

        config = ModelConfig(**{f.name: model[f.name] for f in fields(ModelConfig)
                                if f.name in model})
        key = tuple(sorted(asdict(config).items()))
        if key not in self._targets:
            target, _ = load_target(config)  # sets torch's threads to model.threads
            warm_target(target)
            self._targets = {key: (target,)}
        target, = self._targets[key]
        opened = retriever = None
        if store is not None:
            from heisd_ros.decoding.hybrid import open_warm_store
            from heisd_ros.retrieval.retriever import Retriever, RetrieverConfig
            from heisd_ros.retrieval.store_config import StoreConfig

            cfg = StoreConfig(**{f.name: store[f.name] for f in fields(StoreConfig)
                                 if f.name in store})
            opened = open_warm_store(cfg, target, [replay.task] if replay.task else None)
            retriever = Retriever(opened, RetrieverConfig(k=config.retrieval_k, demote_steps=0))
        try:
            decoder = build_decoder(method, target, config, retriever,
                                    warn=lambda text: print(f"[in-process] {method}: {text}",
                                                            file=sys.stderr))
            task = replay.task or None

            def observation(index: int, episode) -> Observation:
                joint, pose = state_messages(replay.states[index])
                position, rpy = pose_from_msg(pose)  # as the node reads its robot state
                return Observation(replay.third[index], replay.wrist[index],
                                   replay.instruction,
                                   make_proprio(position, rpy, joint.position[6]),
                                   float(index), episode)

            for index in order[:warmup]:
                decoder.decode(observation(index, EpisodeState(task)))
            wall_ms, total_ms, skipped, stages, previous = [], [], [], [], None
            episode = EpisodeState(task)
            for index in order:
                if previous is None or replay.episode[index] != replay.episode[previous]:
                    decoder.begin_episode(task)
                    episode = EpisodeState(task)
                obs = observation(index, episode)
                t = time.perf_counter()
                step = decoder.decode(obs)
                wall_ms.append((time.perf_counter() - t) * 1e3)
                total_ms.append(float(step.fields.get("total_ms", math.nan)))
                skipped.append(bool(step.fields.get("verify_skipped")))
                stages.append({k: float(step.fields.get(k, math.nan)) for k in STAGES})
                if advance:
                    episode = episode.executed(step.action)
                previous = index
            import torch

            return {"wall_ms": wall_ms, "total_ms": [t for t in total_ms if math.isfinite(t)],
                    "indices": list(order), "verify_skipped": skipped, "stages": stages,
                    "threads": torch.get_num_threads(),
                    "decoder": getattr(decoder, "description", "")}
        finally:
            if opened is not None:
                opened.close()


def inprocess_order(phase: dict, n_replay: int, limit: int) -> tuple[list[int], bool, str]:
    """(indices to decode, advance the episode, how chosen) from a graph phase's steps."""
    sent = [i for i in phase.get("hybrid_indices", []) if i is not None]
    if sent:
        return sent[:limit], True, (f"in-process decoded the {min(len(sent), limit)} "
                                    f"observations the node sent commands for, in its order")
    count = min(len(phase.get("held_ms", [])) or 20, limit)
    start = phase.get("start_index", 0)
    return ([(start + k) % n_replay for k in range(count)], False,
            f"no command sent: in-process decoded {count} consecutive replayed observations")


# ------------------------------------------------------------------ the run
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
    import rclpy
    from rclpy.signals import SignalHandlerOptions

    domain = dds_domain_id()
    tmp = Path(tempfile.mkdtemp(prefix="heisd_graph_bench_"))
    env = {**os.environ, "ROS_DOMAIN_ID": str(domain),
           "RCUTILS_CONSOLE_OUTPUT_FORMAT": LOG_FORMAT, "PYTHONUNBUFFERED": "1"}
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=domain,
               signal_handler_options=SignalHandlerOptions.NO)
    children, inproc = Children(tmp, env), InProcess()
    reports, raw, threads = {}, {}, None
    print(f"[graph] domain {domain}; {replay.description}; images {replay.image_note}",
          flush=True)
    try:
        for method in methods:
            files = write_phase_params(method, args, replay, tmp)
            policy_cfg = ros_parameters(files["policy"])
            driver_cfg = ros_parameters(files["driver"])
            threads = policy_cfg["model"]["threads"]
            try:
                phase = run_graph_phase(method, args, replay, files, tmp, env, context,
                                        children)
            finally:
                children.stop()
            phase["load_avg_1min"] = os.getloadavg()[0]
            problem = phase["error"] or phase["died"]
            if problem:
                print(f"[graph] {method}: {problem}", file=sys.stderr)
                for name in phase["logs"]:
                    tail = children.tail(name)
                    if tail and (name == "policy" or name in problem):
                        print(f"--- {name} log tail ({phase['logs'][name]}):\n{tail}",
                              file=sys.stderr)
            raw[method] = {"phase": {k: v for k, v in phase.items() if k != "diagnostics"},
                           "diagnostics": phase.get("diagnostics")}
            if phase["error"]:
                reports[method] = {"error": phase["error"], "logs": phase["logs"]}
                continue
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
                inproc_raw = inproc.run(method, policy_cfg["model"], store, replay, order,
                                        advance, args.warmup)
                inproc_raw["load_avg_1min"] = os.getloadavg()[0]
                raw[method]["inprocess"] = inproc_raw
            report = method_report(phase, inproc_raw, float(policy_cfg["max_command_age_s"]),
                                   driver_cfg.get("controller", {}).get("max_command_age_s"))
            report.update(inprocess_order=how, died=phase["died"], logs=phase["logs"],
                          inprocess_decoder=inproc_raw["decoder"],
                          load_avg_1min={"graph_end": phase["load_avg_1min"],
                                         "inprocess_end": inproc_raw["load_avg_1min"]})
            reports[method] = report
    except KeyboardInterrupt:
        print("[graph] interrupted: stopping the graph", file=sys.stderr)
        return 130
    finally:
        children.stop()
        rclpy.shutdown(context=context)
        signal.signal(signal.SIGTERM, previous)
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


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _jsonable(value):
    if isinstance(value, np.generic):
        return value.item()
    return str(value)


def plot_step_times(raw: dict, path: Path) -> None:
    """Histograms of the step times per method: node (log, HybridStep) vs in-process."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = [m for m in raw if raw[m].get("inprocess")]
    if not methods:
        return
    fig, axes = plt.subplots(len(methods), 1, figsize=(8, 2.6 * len(methods)), squeeze=False)
    for ax, method in zip(axes[:, 0], methods, strict=True):
        phase, inproc = raw[method]["phase"], raw[method]["inprocess"]
        series = {"node: held steps, log (wall)": (phase.get("held_ms", []), "tab:red"),
                  "node: HybridStep.total_ms (sent)": (phase.get("hybrid_total_ms", []),
                                                       "tab:blue"),
                  "in-process (wall)": (inproc.get("wall_ms", []), "tab:green")}
        top = max((max(v) for v, _ in series.values() if v), default=1.0)
        bins = np.linspace(0, top * 1.05, 40)
        for label, (values, colour) in series.items():
            if values:
                ax.hist(values, bins=bins, alpha=0.5, color=colour,
                        label=f"{label} (n={len(values)})")
        ax.set_title(method)
        ax.set_xlabel("step time, ms")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    """``python -m heisd_ros.tools.graph_bench`` = ``heisd-bench graph``."""
    parser = argparse.ArgumentParser(prog="heisd-bench graph", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
