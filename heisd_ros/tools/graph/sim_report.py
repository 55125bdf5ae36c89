"""``heisd-bench sim-graph``'s figures per method (pure) and its Markdown tables.

:func:`method_report` turns the raw recording of one phase (:func:`.phases.run_sim_phase`)
into figures over the running time of episodes; where each comes from: the docstring of
:mod:`heisd_ros.tools.graph.sim_cli`.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence

from heisd_ros.tools.graph.figures import count_log_lines, finite_float, held_by_reason, summary
from heisd_ros.tools.graph.listener import CAMERAS, Status

_EPISODE_OVER_RE = re.compile(
    r"\[(?P<t>\d+(?:\.\d+)?)\] \[[^\]]*\]: episode (?P<episode>\d+) over after "
    r"(?P<world_s>\d+(?:\.\d+)?) s \(world\) and (?P<commands>\d+) commands .*?: "
    r"(?P<how>.*?); (?:the next starts|call ~/reset).*?; so far "
    r"(?P<render_ms>\d+(?:\.\d+)?) ms per frame rendered, (?P<skipped>\d+) frames skipped, "
    r"the world slowed (?P<slowed>\d+) times")
BEHIND_NEEDLE = "of world time behind the clock"


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
    """The figures of one phase from what was recorded (``raw`` of :func:`.run_sim_phase`)."""
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
