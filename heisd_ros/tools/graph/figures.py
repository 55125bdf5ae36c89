"""Pure figures of the graph tools: summaries, ratios, log lines, counters, step statuses.

No ROS: lists of numbers, log lines and diagnostic values in; dicts and numbers out.
"""

from __future__ import annotations

import bisect
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

from heisd_ros.decoding.interface import DRAFT_SOURCE_NAMES
from heisd_ros.tools.graph.listener import STAGES

#: HeiSD's command-rate ratio vs AR agrees with its in-process speed ratio within this.
AGREE_TOLERANCE = 0.10
#: A stamp maps to the frame published with it when this close (ns; frames are 33 ms apart).
STAMP_TOLERANCE_NS = 1_000_000
_HELD_RE = re.compile(r"\[(?P<t>\d+(?:\.\d+)?)\] \[[^\]]*\]: holding, no command: stale command"
                      r".*?decode took (?P<ms>\d+(?:\.\d+)?) ms")
_TIME_RE = re.compile(r"\[(?P<t>\d+(?:\.\d+)?)\] \[")
#: Most common HybridStep statuses reported per method.
STATUS_TOP = 4
_DIGITS_RE = re.compile(r"\d+")


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
                                   for code, name in DRAFT_SOURCE_NAMES.items()},
            "verify_skipped_share": true_share(verify_skipped)}


def true_share(flags: Sequence[bool]) -> float | None:
    """The share of true ``flags``; None without any."""
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


def stage_medians(rows: Sequence[dict]) -> dict[str, float] | None:
    """Median of each of :data:`STAGES` over per-step dicts (None without steps)."""
    if not rows:
        return None
    return {k: float(np.median([r.get(k, math.nan) for r in rows])) for k in STAGES}
