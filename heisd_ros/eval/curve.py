"""Success against speed over several ``heisd-eval`` runs that differ in one setting.

``heisd-eval --curve RUN.json ... --curve-key max_unverified_run --report DIR`` reads the runs'
JSON files, and per method gives one point per run: the run's value of the setting, success
with its 95% Wilson interval, the speed-up by the ratio of mean step latencies (and of
medians) and the unverified share, as a table and a plot (``DIR/curve.png``). Tune on
validation seeds with it, then report on the table's seeds.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def load_runs(paths, option: str = "--curve") -> list[dict]:
    """The JSON results of ``heisd-eval --json`` (ValueError naming an unreadable one)."""
    runs = []
    for path in paths:
        try:
            runs.append(json.loads(Path(path).read_text(encoding="utf-8")))
        except (OSError, ValueError) as err:
            raise ValueError(f"{option}: cannot read {path}: {err}") from err
    return runs


def curve_points(runs: list[dict], key: str) -> dict[str, list[dict]]:
    """Method -> one point per run, ordered by the run's ``config[key]``.

    Raises:
        ValueError: a run without ``config[key]``, or runs that differ in seeds or episodes
            (points of different episodes are not comparable).
    """
    seen = {(r["config"].get("seed"), r["config"].get("episodes_per_task"),
             tuple(r["config"].get("tasks", ()))) for r in runs}
    if len(seen) > 1:
        described = ", ".join(f"seed {s} x {e} episodes on {len(t)} tasks"
                              for s, e, t in sorted(seen, key=str))
        raise ValueError(f"--curve: the runs differ in seed, episodes or tasks ({described})")
    points: dict[str, list[dict]] = {}
    for run in runs:
        if key not in run["config"]:
            raise ValueError(f"--curve-key: {key!r} is not in a run's config "
                             f"(it has {sorted(run['config'])})")
        for method, s in run["suites"]["all"].items():
            points.setdefault(method, []).append({
                "value": run["config"][key], "successes": s["successes"],
                "episodes": s["episodes"], "success_rate": s["success_rate"],
                "sr_wilson95": s["sr_wilson95"],
                "speedup_mean": s.get("speedup_vs_ar_mean", float("nan")),
                "speedup_median": s.get("speedup_vs_ar", float("nan")),
                "unverified_share": s.get("unverified_share", s.get("skip_rate", 0.0))})
    for items in points.values():
        items.sort(key=lambda p: (p["value"] is None, p["value"]))
    return points


def curve_table(points: dict[str, list[dict]], key: str) -> tuple[list[str], list[list[str]]]:
    """(header, rows): one row per method and run."""
    header = ["method", key, "SR [95% CI]", "mean speed-up", "median speed-up", "unverified"]
    rows = []
    for method, items in points.items():
        for p in items:
            lo, hi = p["sr_wilson95"]
            rows.append([method, str(p["value"]),
                         f"{p['successes']}/{p['episodes']} = {p['success_rate']:.2f} "
                         f"[{lo:.2f}, {hi:.2f}]",
                         f"{p['speedup_mean']:.2f}x", f"{p['speedup_median']:.2f}x",
                         f"{p['unverified_share']:.2f}"])
    return header, rows


def plot_curve(path, points: dict[str, list[dict]], key: str) -> Path:
    """Success rate (with its interval) against the mean speed-up, a line per method."""
    from heisd_ros.eval.report import _pyplot, _save

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for method, items in points.items():
        x = np.array([p["speedup_mean"] for p in items])
        y = np.array([p["success_rate"] for p in items])
        lo = np.array([p["sr_wilson95"][0] for p in items])
        hi = np.array([p["sr_wilson95"][1] for p in items])
        line = ax.errorbar(x, y, yerr=[np.maximum(y - lo, 0), np.maximum(hi - y, 0)],
                           fmt="o-", capsize=3, label=method)
        # The value beside each point (the key is in the title); a method whose points all
        # sit in one place (AR, the reference) gets none.
        if len({(round(a, 3), round(b, 3)) for a, b in zip(x, y, strict=True)}) > 1:
            for p, xi, yi in zip(items, x, y, strict=True):
                ax.annotate(f"{p['value']}", (xi, yi), textcoords="offset points",
                            xytext=(4, 4), fontsize=7, color=line[0].get_color())
    ax.axvline(1.0, color="gray", lw=0.6, ls="--")
    ax.set_xlabel("speed-up vs AR, ratio of mean step latencies (this machine)")
    ax.set_ylabel("success rate (95% Wilson interval)")
    ax.set_title(f"success against speed over {key}")
    ax.legend(fontsize=8)
    return _save(fig, path)
