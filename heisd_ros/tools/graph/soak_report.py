"""``heisd-bench soak``'s figures per window, its verdict (pure), its Markdown and its figure.

:func:`window_figures` turns what one window recorded (:mod:`.soak` drains the listener and
samples the processes at each window's end) into its figures; :func:`soak_verdict` judges
the windows against the goals (:data:`RATE_TOLERANCE`, :data:`RSS_GROWTH_MAX`, no traceback,
no command executed past the age limit, no process exited or restarted). Where each figure
comes from: the docstring of :mod:`heisd_ros.tools.graph.soak`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from heisd_ros.tools.graph.figures import (
    counter_deltas,
    held_by_reason,
    status_counts,
    summary,
)
from heisd_ros.tools.graph.sim_report import clip_intervals, episodes_ended, running_intervals

#: The last window's command rate lies within this (relative) of the first window's.
RATE_TOLERANCE = 0.10
#: Every process's RSS grows less than this (relative) from the first window's end to the last.
RSS_GROWTH_MAX = 0.10


def process_figures(samples: Sequence[tuple[float, int, int, float]]) -> dict | None:
    """RSS and CPU of one process over a window from its /proc samples.

    Args:
        samples: ``(time s, pid, VmRSS KiB, utime + stime s)`` in time order; the first may
            be the previous window's last (the window's start). A new pid is a restart: CPU
            time counts only between two samples of one pid.

    Returns:
        ``pid`` and ``rss_mib`` at the last sample, ``rss_max_mib``, ``cpu_pct`` (% of one
        core; None with fewer than two samples of one pid) and ``restarts`` (pid changes);
        None without samples.
    """
    if not samples:
        return None
    cpu_s = wall_s = 0.0
    restarts = 0
    for (t_a, pid_a, _, cpu_a), (t_b, pid_b, _, cpu_b) in zip(samples, samples[1:],
                                                               strict=False):
        if pid_a != pid_b:
            restarts += 1
        elif t_b > t_a:
            cpu_s, wall_s = cpu_s + cpu_b - cpu_a, wall_s + t_b - t_a
    return {"pid": samples[-1][1], "rss_mib": samples[-1][2] / 1024.0,
            "rss_max_mib": max(s[2] for s in samples) / 1024.0,
            "cpu_pct": 100.0 * cpu_s / wall_s if wall_s > 0 else None, "restarts": restarts}


def window_figures(raw: dict, age_limit_s: float) -> dict:
    """The figures of one window from what it recorded.

    Args:
        raw: ``start_s``/``end_s`` (wall s); ``commands``: (arrival s, header stamp s) of
            each EECommand that arrived; ``statuses``: the EpisodeStatus records that arrived
            (:class:`~.listener.Status`); ``carried``: the last status before the window
            (None at the first), which tells whether an episode was running at its start;
            ``step_statuses``: HybridStep status texts; ``policy_before``/``policy_after``:
            the policy's /diagnostics values at the window's start and end; ``processes``:
            per process the samples of :func:`process_figures`; ``tracebacks``: per log the
            "Traceback" lines written in the window; ``events``: exits and restarts seen;
            ``sim_before``/``sim_after``: the sim node's /diagnostics command counters
            ("sim_node: commands") at the window's start and end ({} when none came).
        age_limit_s: the policy's ``max_command_age_s``: commands older than this arriving
            here while an episode runs are counted (``arrived_past_age_limit``); whether
            the arm took them is the sim's count (``sim``).
    """
    t0, t1 = raw["start_s"], raw["end_s"]
    own = list(raw["statuses"])
    known = ([raw["carried"]] if raw.get("carried") is not None else []) + own
    # Without any status the sim never said an episode ran: the whole window counts.
    running = clip_intervals(running_intervals(known, t1), t0, t1) if known else [(t0, t1)]
    running_s = sum(b - a for a, b in running)
    commands = raw["commands"]
    executed = [(t, stamp) for t, stamp in commands if any(a <= t <= b for a, b in running)]
    ages_ms = [(t - stamp) * 1e3 for t, stamp in executed]
    age = summary(ages_ms)
    processes = {name: process_figures(samples) for name, samples in raw["processes"].items()}
    return {
        "start_s": t0, "end_s": t1, "window_s": t1 - t0, "running_s": running_s,
        "commands": len(commands), "commands_while_running": len(executed),
        "command_rate_hz": len(executed) / running_s if running_s > 0 else None,
        "command_rate_wall_hz": len(commands) / (t1 - t0) if t1 > t0 else None,
        "command_age_ms": age and {k: age[k] for k in ("p50", "p99", "max")},
        "age_limit_s": age_limit_s,
        "arrived_past_age_limit": sum(a > age_limit_s * 1e3 for a in ages_ms),
        "sim": sim_age_figures(raw.get("sim_before") or {}, raw.get("sim_after") or {}),
        "held_by_reason": held_by_reason(raw["policy_before"], raw["policy_after"]),
        "step_status": status_counts(raw["step_statuses"]),
        "episodes": episodes_ended(own, -math.inf, math.inf),
        "processes": {k: v for k, v in processes.items() if v is not None},
        "tracebacks": dict(raw["tracebacks"]), "events": list(raw["events"]),
    }


def sim_age_figures(before: dict, after: dict) -> dict | None:
    """The sim's own counts over a window; None when the sim sent no counters.

    Commands refused for their age, commands taken although older than the sim's limit, the
    oldest taken (ms, since the sim started) and the limit (world s; 0: off).
    """
    if "commands_executed_past_age" not in after:
        return None
    delta = counter_deltas(before, after, "commands_")
    return {"refused_for_age": delta["commands_refused_age"],
            "executed_past_age_limit": delta["commands_executed_past_age"],
            "max_executed_age_ms": float(after["max_executed_age_ms"]),
            "age_limit_s": float(after["max_command_age_s"])}


def _check(goal: str, ok: bool | None, detail: str) -> dict:
    return {"goal": goal, "ok": bool(ok), "detail": detail if ok is not None else
            f"unknown: {detail}"}


def soak_verdict(windows: Sequence[dict], rate_tolerance: float = RATE_TOLERANCE,
                 rss_growth_max: float = RSS_GROWTH_MAX) -> dict:
    """The windows against the goals: ``{"passed": bool, "checks": [{goal, ok, detail}]}``.

    The command rate is the one over the running time of episodes (over the whole window
    when none ran); RSS growth compares each process's RSS at the last window's end with
    that at the first window's end. An unknown figure (no window, no command rate) fails
    its check.
    """
    if not windows:
        return {"passed": False, "checks": [_check("at least one window", False, "none")]}
    first, last = windows[0], windows[-1]

    def rate(w: dict) -> float | None:
        return (w["command_rate_hz"] if w["command_rate_hz"] is not None
                else w["command_rate_wall_hz"])

    r0, r1 = rate(first), rate(last)
    known = r0 is not None and r1 is not None and r0 > 0
    change = (r1 / r0 - 1.0) if known else None
    checks = [_check(f"command rate of the last window within {rate_tolerance:.0%} of the "
                     f"first", abs(change) <= rate_tolerance if known else None,
                     f"{_f(r0, '.2f')} -> {_f(r1, '.2f')} /s"
                     + (f" ({change:+.1%})" if known else ""))]
    growth = {name: p["rss_mib"] / first["processes"][name]["rss_mib"] - 1.0
              for name, p in last["processes"].items()
              if first["processes"].get(name, {}).get("rss_mib")}
    worst = max(growth, key=growth.get, default=None)
    checks.append(_check(
        f"RSS growth of every process below {rss_growth_max:.0%} after the first window",
        None if worst is None else growth[worst] < rss_growth_max,
        ", ".join(f"{k} {v:+.1%}" for k, v in sorted(growth.items())) or "no RSS samples"))
    tracebacks = sum(n for w in windows for n in w["tracebacks"].values())
    checks.append(_check("0 tracebacks", tracebacks == 0, f"{tracebacks}"))
    sims = [w["sim"] for w in windows]
    known_sim = all(x is not None and x["age_limit_s"] > 0 for x in sims)
    past = sum(x["executed_past_age_limit"] for x in sims) if known_sim else None
    checks.append(_check(
        "0 commands executed past the age limit", past == 0 if known_sim else None,
        f"{past} (the sim's count, limit {sims[0]['age_limit_s']:g} s; refused for their "
        f"age {sum(x['refused_for_age'] for x in sims)}; arrived here older than the "
        f"policy's {first['age_limit_s']:g} s: {sum(w['arrived_past_age_limit'] for w in windows)})"
        if known_sim else "the sim sent no age counters, or its age check is off"))
    events = [e for w in windows for e in w["events"]]
    restarts = sum(p["restarts"] for w in windows for p in w["processes"].values())
    checks.append(_check("no process exited or restarted", not events and not restarts,
                         "; ".join(events) or f"{restarts} restarts"))
    return {"passed": all(c["ok"] for c in checks), "checks": checks}


def format_verdict(verdict: dict) -> str:
    """One line per goal (PASS/FAIL) and the overall result."""
    lines = [f"{'PASS' if c['ok'] else 'FAIL'}: {c['goal']}: {c['detail']}"
             for c in verdict["checks"]]
    return "\n".join([*lines, f"soak {'PASSED' if verdict['passed'] else 'FAILED'}"])


# ------------------------------------------------------------------ Markdown
def _f(value, fmt: str = ".1f") -> str:
    return "n/a" if value is None else format(value, fmt)


def _held(w: dict) -> str:
    return ", ".join(f"{k} {n}" for k, n in sorted(w["held_by_reason"].items())) or "none"


def window_table(index: int, w: dict, t_first_s: float) -> list[str]:
    """One window's table: its figures, then one row per process."""
    age, ep = w["command_age_ms"] or {}, w["episodes"]
    statuses = "; ".join(f"{text or '(none)'} {n}" for text, n in w["step_status"]["top"])
    rows = [("commands (while an episode ran)", f"{w['commands']} ({w['commands_while_running']})"),
            ("cmd/s over running time / over the window",
             f"{_f(w['command_rate_hz'], '.2f')} / {_f(w['command_rate_wall_hz'], '.2f')}"),
            ("cmd age p50 / p99 / max ms", f"{_f(age.get('p50'), '.0f')} / "
             f"{_f(age.get('p99'), '.0f')} / {_f(age.get('max'), '.0f')}"),
            ("executed past / refused for the age limit (sim's count, limit s)",
             f"{w['sim']['executed_past_age_limit']} / {w['sim']['refused_for_age']} "
             f"({w['sim']['age_limit_s']:g})" if w["sim"] else "unknown"),
            (f"arrived here older than the policy's {w['age_limit_s']:g} s",
             str(w["arrived_past_age_limit"])),
            ("held by reason (policy refused[...])", _held(w)),
            ("HybridStep status (top)", statuses or "none"),
            ("episodes ok / ended", f"{ep['successes']} / {ep['ended']}"),
            ("tracebacks", ", ".join(f"{k} {n}" for k, n in w["tracebacks"].items() if n)
             or "0"),
            ("exits, restarts", "; ".join(w["events"]) or "none")]
    lines = [f"### window {index + 1}: {(w['start_s'] - t_first_s) / 60:.1f}-"
             f"{(w['end_s'] - t_first_s) / 60:.1f} min ({w['running_s']:.0f} s of episodes)",
             "", "| figure | value |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    lines += ["", "| process | pid | RSS MiB (max) | CPU % of one core | restarts |",
              "| --- | --- | --- | --- | --- |"]
    lines += [f"| {name} | {p['pid']} | {p['rss_mib']:.0f} ({p['rss_max_mib']:.0f}) | "
              f"{_f(p['cpu_pct'])} | {p['restarts']} |" for name, p in w["processes"].items()]
    return [*lines, ""]


def format_markdown(result: dict) -> str:
    """The run's set-up, one table per window and the verdict."""
    setup, windows = result["setup"], result["windows"]
    lines = [f"## soak ({setup['date']})", "",
             f"method {setup['method']}, task {setup['task']}, sim realtime at the launch's "
             f"settings; {setup['duration_s'] / 60:.3g} min in windows of "
             f"{setup['window_s'] / 60:.3g} min after the first command; DB "
             f"{setup['db'] or '(none)'}; logs in {setup['logs']}. RSS and CPU from /proc "
             f"(Linux); command ages and rates at this listener.", ""]
    t_first = windows[0]["start_s"] if windows else 0.0
    for i, w in enumerate(windows):
        lines += window_table(i, w, t_first)
    lines += ["### verdict", "", "```", format_verdict(result["verdict"]), "```", ""]
    return "\n".join(lines)


# ------------------------------------------------------------------ figure
def plot_windows(windows: Sequence[dict], path: Path) -> Path | None:
    """Plot command rate, age p50/p99, RSS and CPU per process over the windows.

    Returns the PNG's path; None without matplotlib (the ``report`` extra) or windows.
    """
    try:
        import matplotlib
    except ImportError:
        return None
    if not windows:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t_first = windows[0]["start_s"]
    x = [(w["end_s"] - t_first) / 60.0 for w in windows]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    (rate_ax, age_ax), (rss_ax, cpu_ax) = axes
    nan = float("nan")

    def series(key, sub=None):
        return [nan if (v := (w[key] if sub is None else (w[key] or {}).get(sub))) is None
                else v for w in windows]

    rate_ax.plot(x, series("command_rate_hz"), "o-", label="over running time")
    rate_ax.plot(x, series("command_rate_wall_hz"), "s--", label="over the window")
    rate_ax.set_ylabel("commands / s")
    age_ax.plot(x, series("command_age_ms", "p50"), "o-", label="p50")
    age_ax.plot(x, series("command_age_ms", "p99"), "s-", label="p99")
    age_ax.axhline(windows[0]["age_limit_s"] * 1e3, color="red", ls=":", label="limit")
    age_ax.set_ylabel("command age, ms")
    names = list(dict.fromkeys(n for w in windows for n in w["processes"]))
    for name in names:
        procs = [w["processes"].get(name) for w in windows]
        rss_ax.plot(x, [p["rss_mib"] if p else nan for p in procs], "o-", label=name)
        cpu_ax.plot(x, [nan if not p or p["cpu_pct"] is None else p["cpu_pct"] for p in procs],
                    "o-", label=name)
    rss_ax.set_ylabel("RSS, MiB")
    cpu_ax.set_ylabel("CPU, % of one core")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes[1]:
        ax.set_xlabel("minutes after the first command (window end)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
