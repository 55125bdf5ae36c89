"""Reports of ``heisd-eval`` and ``heisd-replay``: text tables, JSON, Markdown with PNG plots.

Plots (matplotlib, Agg backend, imported lazily): EE trajectories coloured by router mode,
latency per step, accepted-length histogram, and success rate (or agreement) against
speed-up per method.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

#: Colour of each router mode in the trajectory plot.
MODE_COLOURS = {"drafter": "tab:blue", "retrieval": "tab:orange", "skip": "tab:red",
                "off": "tab:gray"}


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned plain-text table, columns as wide as their widest cell."""
    widths = [max(len(str(c)) for c in col) + 2 for col in zip(header, *rows, strict=True)]
    return "\n".join("".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
                     for line in [header, *rows])


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """The same table in GitHub Markdown."""
    lines = ["| " + " | ".join(h.replace("|", "\\|") for h in header) + " |",
             "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |"
              for row in rows]
    return "\n".join(lines)


def write_json(path: str | Path, data: dict) -> Path:
    """Write ``data`` as indented JSON (numpy scalars converted), creating parent dirs."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=jsonable) + "\n")
    return path


def jsonable(value):
    """``json.dumps(default=...)``: numpy scalars and arrays, paths."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_trajectories(path: Path, trajectories: dict[str, list[tuple[np.ndarray, list[str]]]],
                      title: str) -> Path:
    """Top view (x, y) and side view (x, z) of EE positions, points coloured by router mode.

    Args:
        path: PNG to write.
        trajectories: method -> list of (positions (T, 3) m, router mode per step).
        title: figure title.
    """
    plt = _pyplot()
    names = list(trajectories) or ["(none)"]
    fig, axes = plt.subplots(2, len(names), figsize=(3.6 * len(names), 6.4), squeeze=False)
    for col, name in enumerate(names):
        for row, (dim, label) in enumerate(((1, "y [m]"), (2, "z [m]"))):
            ax = axes[row][col]
            for xyz, modes in trajectories.get(name, []):
                xyz = np.asarray(xyz, dtype=float).reshape(-1, 3)
                ax.plot(xyz[:, 0], xyz[:, dim], color="lightgray", lw=0.8, zorder=1)
                colours = [MODE_COLOURS.get(m, "black") for m in modes[:len(xyz)]]
                ax.scatter(xyz[:, 0], xyz[:, dim], c=colours, s=9, zorder=2)
            ax.set_xlabel("x [m]")
            ax.set_ylabel(label)
            if row == 0:
                ax.set_title(name)
    handles = [plt.Line2D([], [], marker="o", ls="", color=c, label=m)
               for m, c in MODE_COLOURS.items()]
    axes[0][0].legend(handles=handles, fontsize=7, title="router mode", title_fontsize=7)
    fig.suptitle(title)
    return _save(fig, path)


def plot_latency(path: Path, latency_ms: dict[str, Sequence[float]], title: str) -> Path:
    """Total decode latency per step (ms) of each method, in step order."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for name, ms in latency_ms.items():
        ax.plot(np.arange(len(ms)), ms, lw=0.9, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("latency per action [ms]")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_accepted_lengths(path: Path, rounds: dict[str, Sequence[int]], title: str) -> Path:
    """Histogram of accepted length per verification round (bonus included), per method."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    drafted = {n: r for n, r in rounds.items() if len(r)}
    width = 0.8 / max(len(drafted), 1)
    for k, (name, values) in enumerate(drafted.items()):
        counts = np.bincount(np.asarray(values, dtype=int), minlength=8)[1:8]
        ax.bar(np.arange(1, 8) + (k - (len(drafted) - 1) / 2) * width,
               counts / max(counts.sum(), 1), width=width, label=name)
    if not drafted:
        ax.text(0.5, 0.5, "no drafted rounds (AR only)", ha="center", transform=ax.transAxes)
    ax.set_xlabel("accepted length per round [tokens]")
    ax.set_ylabel("share of rounds")
    ax.set_title(title)
    if drafted:
        ax.legend(fontsize=8)
    return _save(fig, path)


def plot_quality_vs_speed(path: Path, points: dict[str, tuple[float, float, float, float]],
                          ylabel: str, title: str) -> Path:
    """One point per method: (speed-up, value, low, high) with a vertical interval."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for name, (x, y, lo, hi) in points.items():
        ax.errorbar([x], [y], yerr=[[max(y - lo, 0)], [max(hi - y, 0)]], fmt="o", capsize=3,
                    label=name)
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(5, 5), fontsize=8)
    ax.axvline(1.0, color="gray", lw=0.6, ls="--")
    ax.set_xlabel("speed-up vs AR (wall clock, this machine)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def write_markdown(path: str | Path, title: str, sections: Sequence[tuple[str, str]],
                   images: Sequence[Path] = ()) -> Path:
    """Markdown report: a title, (heading, body) sections, then the plots (relative links)."""
    path = Path(path)
    lines = [f"# {title}", ""]
    for heading, body in sections:
        lines += [f"## {heading}", "", body.rstrip(), ""]
    if images:
        lines += ["## Plots", ""]
        lines += [f"![{Path(i).stem}]({Path(i).relative_to(path.parent)})\n" for i in images]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    return path


def projection_markdown(projection: dict) -> str:
    """The projection section: label, the profile's costs and assumptions, a row per method."""
    def speedup(r) -> str:
        ratio = r["projected_speedup_vs_ar"]
        return "-" if ratio is None else f"{ratio:.2f}x"

    rows = [[name, f"{r['target_forwards_per_action']:.2f}",
             f"{r['drafter_forwards_per_action']:.2f}", f"{r['retrievals_per_action']:.2f}",
             f"{r['skip_rate']:.2f}", f"{r['projected_ms_per_action']:.1f}", speedup(r)]
            for name, r in projection["methods"].items()]
    costs = ", ".join(f"{k} {v:g}" for k, v in projection["costs_ms"].items())
    return (f"**{projection['label']}.**\n\nComponent costs (ms): {costs}.\n\nAssumptions:\n"
            + "\n".join(f"- {a}" for a in projection["assumptions"]) + "\n\n"
            + markdown_table(["method", "target fwd/action", "drafter fwd/action",
                              "retrievals/action", "unverified share", "projected ms/action",
                              "projected speed-up"], rows))
