r"""Each method against AR on the same episodes, from ``heisd-eval --json`` result files.

Every method in a ``heisd-eval`` run decides on the same seeded episodes as AR, so successes
pair up. Per suite (and over all) and per method this prints, as a Markdown table:

* success, and the difference to AR in points with its paired 95% interval (normal
  approximation on the per-episode differences);
* wins / AR's wins: episodes only the method solved, episodes only AR solved, and the exact
  two-sided McNemar p (a binomial test on the discordant pairs);
* on the episodes both solved (real time only): how many, and the method's world time to
  success, commands and world time per command, each as the ratio of the method's mean to
  AR's mean over those episodes.

    python scripts/pair_against_ar.py runs/table/eval.json [more.json ...]

Several files are merged (a method's episodes from different runs, AR's from any of them);
an episode key (suite, task, seed, method) seen twice must have the same outcome.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


def load_episodes(paths) -> dict[tuple[str, str, int, str], dict]:
    """(suite, task, seed, method) -> the episode's entry, over all files.

    Raises:
        ValueError: the same episode with two different outcomes, or a file without episodes.
    """
    out: dict[tuple[str, str, int, str], dict] = {}
    for path in paths:
        data = json.loads(Path(path).read_text())
        if "episodes" not in data:
            raise ValueError(f"{path}: no 'episodes' (not a heisd-eval --json result)")
        for e in data["episodes"]:
            key = (e["suite"], e["task"], int(e["seed"]), e["method"])
            if key in out and out[key]["success"] != e["success"]:
                raise ValueError(f"{path}: {key} differs from an earlier file")
            out[key] = e
    return out


def mcnemar_p(wins: int, losses: int) -> float:
    """Exact two-sided McNemar p: the discordant pairs against Binomial(n, 1/2)."""
    n = wins + losses
    if n == 0:
        return 1.0
    k = min(wins, losses)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0 ** n
    return min(1.0, 2.0 * tail)


def paired_difference(method: list[bool], ar: list[bool]) -> tuple[float, float, float]:
    """Success difference in points with its paired 95% interval (normal approximation)."""
    n = len(method)
    d = [float(m) - float(a) for m, a in zip(method, ar, strict=True)]
    mean = sum(d) / n
    var = sum((x - mean) ** 2 for x in d) / (n - 1) if n > 1 else 0.0
    half = 1.96 * math.sqrt(var / n)
    return 100 * mean, 100 * (mean - half), 100 * (mean + half)


def compare(episodes: dict, method: str, suite: str | None) -> dict | None:
    """The method against AR on the episodes both ran (suite None: every suite)."""
    pairs = []
    for (s, task, seed, m), e in sorted(episodes.items()):
        if m != method or (suite is not None and s != suite):
            continue
        ar = episodes.get((s, task, seed, "ar"))
        if ar is not None:
            pairs.append((e, ar))
    if not pairs:
        return None
    ok = [e["success"] for e, _ in pairs]
    ok_ar = [a["success"] for _, a in pairs]
    diff, lo, hi = paired_difference(ok, ok_ar)
    wins = sum(m and not a for m, a in zip(ok, ok_ar, strict=True))
    losses = sum(a and not m for m, a in zip(ok, ok_ar, strict=True))
    both = [(e, a) for e, a in pairs if e["success"] and a["success"]
            and e.get("world_time_s") is not None and a.get("world_time_s") is not None]
    row = {"episodes": len(pairs), "successes": sum(ok), "ar_successes": sum(ok_ar),
           "diff_points": diff, "diff_lo": lo, "diff_hi": hi, "wins": wins, "losses": losses,
           "p": mcnemar_p(wins, losses), "both": len(both)}
    if both:
        def ratio(key):
            return (sum(e[key] for e, _ in both) / sum(a[key] for _, a in both))
        row["world_time_vs_ar"] = ratio("world_time_s")
        row["commands_vs_ar"] = ratio("commands")
        row["world_s_per_command_vs_ar"] = row["world_time_vs_ar"] / row["commands_vs_ar"]
        row["world_s_to_success"] = sum(e["world_time_s"] for e, _ in both) / len(both)
    return row


def table(episodes: dict) -> str:
    """The Markdown table: per suite (then all) and per method other than AR."""
    suites = sorted({k[0] for k in episodes})
    methods = sorted({k[3] for k in episodes} - {"ar"})
    header = ["suite", "method", "success", "AR", "SR - AR, points [95%]",
              "wins / AR wins (p)", "both solved", "world time vs AR", "commands vs AR",
              "world s per command vs AR"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for suite in [*suites, None] if len(suites) > 1 else suites:
        for method in methods:
            r = compare(episodes, method, suite)
            if r is None:
                continue
            n = r["episodes"]
            cells = [suite or "all", method, f"{r['successes']}/{n}", f"{r['ar_successes']}/{n}",
                     f"{r['diff_points']:+.1f} [{r['diff_lo']:.1f}, {r['diff_hi']:.1f}]",
                     f"{r['wins']} / {r['losses']} ({r['p']:.2g})", str(r["both"])]
            cells += [f"{r[k]:.2f}x" if k in r else "-" for k in
                      ("world_time_vs_ar", "commands_vs_ar", "world_s_per_command_vs_ar")]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    """Print the table for the result files; 2 on a file it cannot use."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="heisd-eval --json result files")
    args = parser.parse_args(argv)
    try:
        episodes = load_episodes(args.results)
    except (OSError, ValueError, KeyError) as exc:
        sys.stderr.write(f"pair_against_ar: {exc}\n")
        return 2
    if not any(k[3] == "ar" for k in episodes):
        sys.stderr.write("pair_against_ar: no AR episodes to pair with\n")
        return 2
    sys.stdout.write(table(episodes) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
