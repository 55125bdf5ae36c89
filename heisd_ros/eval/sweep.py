"""Success against decision latency: several real-time ``heisd-eval`` runs, one per latency.

``heisd-eval --sweep RUN.json ... --report DIR`` reads runs made with ``--real-time
--latency-profile P`` (``fixed:<ms>`` for a fixed decision latency, or a machine's profile)
on the same seeds, and per run, suite and method gives success with its 95% Wilson interval,
world seconds to success, the late share (commands older than a control period) and the
mean command age, as a table and a plot (``DIR/sweep.png``): where speed matters in these
tasks, and how much.
"""

from __future__ import annotations

from pathlib import Path

from heisd_ros.eval.curve import load_runs


def sweep_points(runs: list[dict]) -> list[dict]:
    """One point per run, suite and method, ordered by the method's mean command age.

    Raises:
        ValueError: a run not in real time, or runs that differ in seeds, episodes or tasks.
    """
    seen = {(r["config"].get("seed"), r["config"].get("episodes_per_task"),
             tuple(r["config"].get("tasks", ()))) for r in runs}
    if len(seen) > 1:
        raise ValueError("--sweep: the runs differ in seed, episodes or tasks")
    points = []
    for run in runs:
        timing = run.get("timing", {})
        if timing.get("mode") != "real_time":
            raise ValueError("--sweep: every run must be a --real-time run")
        profile = (timing.get("latency_profile") or {}).get("name") or \
            f"wall clock x {timing.get('time_scale')}"
        for suite, summary in run["suites"].items():
            for method, s in summary.items():
                rt = s.get("real_time") or {}
                age = (rt.get("command_age_ms") or {})
                points.append({
                    "profile": profile, "suite": suite, "method": method,
                    "successes": s["successes"], "episodes": s["episodes"],
                    "success_rate": s["success_rate"], "sr_wilson95": s["sr_wilson95"],
                    "world_time_to_success_s": rt.get("world_time_to_success_s_mean"),
                    "late_share": rt.get("late_share"), "command_age_p50_ms": age.get("p50")})
    points.sort(key=lambda p: (p["suite"] != "all", p["suite"], p["method"],
                               p["command_age_p50_ms"] or 0.0))
    return points


def sweep_table(points: list[dict]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the sweep."""
    def cell(value, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    header = ["suite", "method", "latency profile", "command age p50 ms", "success [95% CI]",
              "world s to success", "late"]
    rows = []
    for p in points:
        lo, hi = p["sr_wilson95"]
        rows.append([p["suite"], p["method"], p["profile"], cell(p["command_age_p50_ms"], ".0f"),
                     f"{p['successes']}/{p['episodes']} = {p['success_rate']:.0%} "
                     f"[{lo:.0%}, {hi:.0%}]",
                     cell(p["world_time_to_success_s"], ".2f"), cell(p["late_share"], ".0%")])
    return header, rows


def plot_sweep(path, points: list[dict], method: str = "ar") -> Path:
    """Success (with 95% intervals) and world time to success against command age, per suite.

    ``method``'s points draw a line per suite; the other methods' points (runs at a profile
    with several methods) are single markers with their intervals at their own command age.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for suite in sorted({p["suite"] for p in points}, key=lambda s: (s == "all", s)):
        mine = [p for p in points if p["suite"] == suite and p["method"] == method
                and p["command_age_p50_ms"] is not None]
        if not mine:
            continue
        x = [p["command_age_p50_ms"] for p in mine]
        y = [p["success_rate"] for p in mine]
        err = [[p["success_rate"] - p["sr_wilson95"][0] for p in mine],
               [p["sr_wilson95"][1] - p["success_rate"] for p in mine]]
        style = {"linewidth": 2.5, "color": "black"} if suite == "all" else {"alpha": 0.8}
        left.errorbar(x, y, yerr=err if suite == "all" else None, marker="o", capsize=3,
                      label=suite, **style)
        won = [(a, p["world_time_to_success_s"]) for a, p in zip(x, mine, strict=True)
               if p["world_time_to_success_s"] is not None]
        if won:
            right.plot(*zip(*won, strict=True), marker="o", label=suite, **style)
    # other methods of the same runs (a run at a profile with several methods): one marker
    # each, at its own command age, on the suite drawn in black (or the only one)
    suites = {p["suite"] for p in points}
    main = "all" if "all" in suites else (next(iter(suites)) if len(suites) == 1 else None)
    others = [p for p in points if p["method"] != method and p["suite"] == main
              and p["command_age_p50_ms"] is not None]
    for marker, p in zip("sD^vP*Xh" * len(others), others, strict=False):
        left.errorbar([p["command_age_p50_ms"]], [p["success_rate"]],
                      yerr=[[p["success_rate"] - p["sr_wilson95"][0]],
                            [p["sr_wilson95"][1] - p["success_rate"]]],
                      marker=marker, markersize=8, capsize=3, linestyle="none",
                      label=f"{p['method']} ({p['profile']})")
    for name in sorted({p["profile"] for p in points if not p["profile"].startswith("fixed:")}):
        ages = [p["command_age_p50_ms"] for p in points if p["profile"] == name
                and p["method"] == method and p["suite"] == "all"]
        for age in ages:
            left.axvline(age, linestyle=":", color="grey")
            left.annotate(name, (age, 0.02), rotation=90, fontsize=8, color="grey")
    left.set(xlabel=f"{method}: command age p50 (ms of world time)", ylabel="success rate",
             ylim=(0, 1), title="success against decision latency (95% Wilson for all)")
    right.set(xlabel=f"{method}: command age p50 (ms)", ylabel="world s to success (mean)",
              title="time to success")
    for axes in (left, right):
        if axes.get_legend_handles_labels()[0]:
            axes.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


__all__ = ["load_runs", "plot_sweep", "sweep_points", "sweep_table"]
