"""Closed-loop evaluation on the simulator (library part of ``heisd-eval``).

For every task, every method runs the same seeded episodes. Methods are interleaved per
episode (the order rotates with the episode index), so drift in machine load hits all methods
alike; speed-up vs AR is measured in the same run. The simulator is built once per task.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from heisd_ros.eval import metrics
from heisd_ros.eval.methods import DecoderPolicy

#: Called after every (episode, method) with (suite, task, seed, method, success).
EpisodeCallback = Callable[[str, str, int, str, bool], None]


@dataclass
class EpisodeRun:
    """One episode of one method: outcome, per-step records and EE positions (m)."""

    suite: str
    task: str
    seed: int
    method: str
    success: bool
    steps: list[dict] = field(default_factory=list)
    ee_positions_m: list[list[float]] = field(default_factory=list)
    #: How far the episode got with each goal object (``heisd_ros.sim.progress``).
    progress: dict[str, dict[str, bool]] = field(default_factory=dict)
    #: Real time only (None in lockstep): world time the episode took (s), commands applied.
    world_time_s: float | None = None
    commands: int | None = None


def run_interleaved_episodes(decoders: dict, tasks: Sequence[tuple[str, str]], episodes: int,
                             seed: int, max_steps: int | None = None, sim_config=None,
                             progress: EpisodeCallback | None = None,
                             realtime=None, view_dir=None) -> list[EpisodeRun]:
    """Every method on every task for ``episodes`` seeds ``seed, seed + 1, ...``.

    Args:
        decoders: method name -> decoder (``decode(observation) -> ActionResult``).
        tasks: (suite, task) pairs.
        episodes: episodes per task and method.
        seed: seed of the first episode.
        max_steps: step limit per episode (None = the task's own).
        sim_config: ``SimConfig`` of the simulator.
        progress: called after every episode of every method.
        realtime: ``heisd_ros.sim.runner.RealTime`` to let the world move while a method
            decides (its latency then costs world time); None runs lockstep. The progress
            stages are then read at every command.
        view_dir: write every episode as a Rerun recording
            ``<view_dir>/<suite>/<task>/<method>_seed<seed>.rrd`` (``heisd-view``).
    """
    from heisd_ros.sim.env import PiperSimEnv
    from heisd_ros.sim.progress import EpisodeProgress
    from heisd_ros.sim.runner import run_episodes
    from heisd_ros.sim.suites import get_task

    if view_dir is not None:
        from heisd_ros.eval.recording import EpisodeTape
    if episodes < 1:
        raise ValueError(f"episodes: expected >= 1, got {episodes}")
    names = list(decoders)
    policies = {n: DecoderPolicy(d) for n, d in decoders.items()}
    runs = []
    for suite, task in tasks:
        for policy in policies.values():
            policy.task = task
        with PiperSimEnv(get_task(suite, task), sim_config) as env:
            for i in range(episodes):
                shift = i % len(names)
                for name in names[shift:] + names[:shift]:
                    positions: list[list[float]] = []
                    tracker: list[EpisodeProgress] = []
                    tape = None if view_dir is None else EpisodeTape(
                        suite, task, env.task.instruction, seed + i,
                        env.config.control_rate_hz)

                    def observe(ep, step, obs, action, outcome, positions=positions,
                                tracker=tracker, tape=tape):
                        if not tracker:  # the env was just reset for this episode
                            tracker.append(EpisodeProgress(env))
                        tracker[0].update(action)
                        positions.append(np.asarray(obs.proprio[:3], float).tolist())
                        if tape is not None:
                            tape(0, step, obs, action, outcome)

                    result = run_episodes(policies[name], suite, task, 1, seed + i, max_steps,
                                          observer=observe, env=env,
                                          realtime=realtime).episodes[0]
                    policies[name].end_episode(bool(result.success))
                    if tape is not None and result.stats:
                        _write_view(view_dir, suite, task, name, seed + i,
                                    tape.finish(0, bool(result.success)), result.stats)
                    runs.append(EpisodeRun(suite, task, seed + i, name, bool(result.success),
                                           list(result.stats), positions,
                                           tracker[0].result() if tracker else {},
                                           result.world_time_s, result.commands))
                    if progress is not None:
                        progress(suite, task, seed + i, name, bool(result.success))
    return runs


def _write_view(view_dir, suite: str, task: str, method: str, seed: int, record,
                stats) -> None:
    from heisd_ros.viewer.files import write_episode
    from heisd_ros.viewer.sources import eval_steps

    path = Path(view_dir) / suite / task / f"{method}_seed{seed}.rrd"
    write_episode(path, f"{suite}/{task} {method} seed {seed}", eval_steps(record, stats))


def summarise_runs(runs: Sequence[EpisodeRun], reference: str = "ar") -> dict[str, dict]:
    """Per method: SR with Wilson 95% interval, counters, latency, stages, speed-up vs AR.

    ``speedup_vs_ar`` is the ratio of median step latencies, ``speedup_vs_ar_mean`` of means.

    ``first_goal_progress`` is the fraction of episodes whose first goal object was reached,
    grasped and lifted (``heisd_ros.sim.progress``): where a policy fails when SR is low.

    Real-time runs (``world_time_s`` set) also get ``real_time``
    (:func:`heisd_ros.eval.metrics.real_time_summary`).
    """
    by_method: dict[str, list[EpisodeRun]] = {}
    for r in runs:
        by_method.setdefault(r.method, []).append(r)
    ref_ms = [s["stage_ms"]["total"] for r in by_method.get(reference, []) for s in r.steps]
    out = {}
    for name, items in by_method.items():
        steps = [s for r in items for s in r.steps]
        ms = [s["stage_ms"]["total"] for s in steps]
        wins = sum(r.success for r in items)
        low, high = metrics.wilson_interval(wins, len(items))
        out[name] = {"episodes": len(items), "successes": wins,
                     "success_rate": wins / len(items), "sr_wilson95": [low, high],
                     **metrics.counters_summary(steps),
                     **metrics.unverified_summary([r.steps for r in items]),
                     **metrics.checks_summary([r.steps for r in items]),
                     "latency": metrics.latency_summary(ms),
                     "stage_ms_median": metrics.stage_breakdown(steps),
                     "speedup_vs_ar": metrics.speedup(ms, ref_ms),
                     "speedup_vs_ar_mean": metrics.speedup_mean(ms, ref_ms),
                     "first_goal_progress": metrics.first_goal_progress(
                         [r.progress for r in items])}
        timed = [r for r in items if r.world_time_s is not None]
        if timed:
            out[name].update(metrics.real_time_summary(
                [r.world_time_s for r in timed], [r.commands for r in timed],
                [s for r in timed for s in r.steps], [r.success for r in timed]))
    return out


def summarise_by_suite(runs: Sequence[EpisodeRun]) -> dict[str, dict[str, dict]]:
    """:func:`summarise_runs` per suite, plus "all" over every suite when there are several."""
    suites = sorted({r.suite for r in runs})
    out = {s: summarise_runs([r for r in runs if r.suite == s]) for s in suites}
    out["all"] = summarise_runs(runs) if len(suites) > 1 else out[suites[0]]
    return out


def table_rows(summary: dict[str, dict]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the evaluation table of one suite.

    Real-time runs get five more columns: commands per world second, the command age (world
    ms from the decision's frame to the command) p50 and p99, the share of commands later
    than a control period, and world seconds per episode.
    """
    header = ["method", "SR [95% CI]", "speed-up", "mean speed-up", "AL", "fwd/action",
              "unverified", "longest run", "router share", "p50 ms", "mean ms", "p99 ms"]
    timed = any("real_time" in s for s in summary.values())
    if timed:
        header += ["cmd/s", "cmd age p50 ms", "cmd age p99 ms", "late", "world s/ep"]
    rows = []
    for name, s in summary.items():
        lo, hi = s["sr_wilson95"]
        rows.append([name, f"{s['success_rate']:.2f} [{lo:.2f}, {hi:.2f}]",
                     f"{s['speedup_vs_ar']:.2f}x",
                     f"{s.get('speedup_vs_ar_mean', float('nan')):.2f}x",
                     f"{s.get('al', 1.0):.2f}",
                     f"{s.get('target_forwards_per_action', float('nan')):.2f}",
                     f"{s.get('skip_rate', 0.0):.2f}",
                     str(s.get("longest_unverified_run", 0)),
                     " ".join(f"{m}:{v:.2f}" for m, v in s.get("router_share", {}).items()),
                     f"{s['latency']['p50_ms']:.1f}", f"{s['latency']['mean_ms']:.1f}",
                     f"{s['latency']['p99_ms']:.1f}"])
        if timed:
            rows[-1] += _real_time_cells(s.get("real_time") or {})
    return header, rows


def _real_time_cells(rt: dict) -> list[str]:
    """The real-time columns of one method's row ("-" where there is nothing)."""
    def cell(value, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    age = rt.get("command_age_ms") or {}
    return [cell(rt.get("command_rate_hz"), ".2f"), cell(age.get("p50"), ".1f"),
            cell(age.get("p99"), ".1f"), cell(rt.get("late_share"), ".1%"),
            cell(rt.get("world_time_s_mean"), ".2f")]


def late_rows(summary: dict[str, dict]) -> tuple[list[str], list[list[str]]]:
    """(header, rows): real-time decisions per method and kind of step (no rows in lockstep).

    A decision later than the control period pushes the next one to a later camera frame, so
    a kind's mean period (decision start to the next start) is what it costs the episode.
    """
    header = ["method", "kind of decision", "steps", "late", "cmd age mean ms",
              "period mean ms"]
    rows = []
    for name, s in summary.items():
        for kind, k in ((s.get("real_time") or {}).get("by_step_kind") or {}).items():
            period = k["period_ms_mean"]
            rows.append([name, kind, f"{k['steps']} ({k['share']:.0%})",
                         f"{k['late_share']:.0%}", f"{k['command_age_ms_mean']:.1f}",
                         "-" if period is None else f"{period:.1f}"])
    return header, rows


def checks_rows(suites: dict[str, dict]) -> tuple[list[str], list[list[str]]]:
    """(header, rows): per suite and method, how executed actions were checked and the cost.

    Step latency stays the headline; beside it the target forwards and CPU time per action
    (checks behind included), so latency is not taken for saved compute.
    """
    header = ["suite", "method", "mean ms", "VLA fwd / action", "CPU ms / action",
              "checked (before + behind)", "unverified, checked behind",
              "rejected behind (by rule)", "rejected at position / rotation / gripper",
              "rejected: bins off mean / max",
              "next step waited"]
    rows = []
    for suite, summary in suites.items():
        if suite == "all" and len(suites) == 2:
            continue
        for name, s in summary.items():
            c = s.get("checks")
            if not c:
                continue
            rules = ", ".join(f"{r} {e['rejected']}/{e['checks']}"
                              for r, e in c["behind_by_rule"].items())
            rate, diff, cpu = (c["behind_rejection_rate"], c["rejected_bin_difference"],
                               s["cpu_ms_per_action"])
            rows.append([
                suite, name, f"{s['latency']['mean_ms']:.1f}",
                f"{s['vla_forwards_per_action']:.2f}", "-" if cpu is None else f"{cpu:.1f}",
                f"{c['checked_share']:.1%}",
                f"{c['checked_behind']}/{c['checked_behind'] + c['unchecked']}",
                "-" if rate is None else f"{rate:.1%} ({rules})",
                "-" if rate is None else " / ".join(str(n) for n in c["rejected_at"].values()),
                "-" if diff["mean"] is None else f"{diff['mean']:.1f} / {diff['max']}",
                f"{c['waited']}/{c['collected']}"
                + (f" ({c['wait_ms_mean']:.1f} ms)" if c["waited"] else "")])
    return header, rows


def write_eval_report(out_dir, result: dict, runs: Sequence[EpisodeRun]) -> dict[str, str]:
    """Markdown report and PNG plots of an evaluation; returns {kind: path}."""
    from pathlib import Path

    from heisd_ros.eval import report
    from heisd_ros.eval.replay import display_mode

    out = Path(out_dir)
    overall = result["suites"]["all"]
    names = list(overall)
    first_task = (runs[0].suite, runs[0].task) if runs else None
    traj = {n: [(np.array(r.ee_positions_m).reshape(-1, 3), [display_mode(s) for s in r.steps])
                for r in runs if r.method == n and (r.suite, r.task) == first_task]
            for n in names}
    images = [
        report.plot_trajectories(out / "trajectories.png", traj,
                                 f"EE trajectories on {'/'.join(first_task or ('-',))}, "
                                 f"coloured by router mode"),
        report.plot_latency(out / "latency_per_step.png",
                            {n: [s["stage_ms"]["total"] for r in runs if r.method == n
                                 for s in r.steps] for n in names},
                            "decode latency per step (all episodes in run order)"),
        report.plot_accepted_lengths(out / "accepted_length_hist.png",
                                     {n: [k for r in runs if r.method == n for s in r.steps
                                          for k in s["accepted_lengths"]] for n in names},
                                     "accepted length per round"),
        report.plot_quality_vs_speed(
            out / "sr_vs_speedup.png",
            {n: (s["speedup_vs_ar"], s["success_rate"], *s["sr_wilson95"])
             for n, s in overall.items()}, "success rate (95% Wilson)", "SR vs speed-up")]
    cfg = result["config"]
    sections = [("Setup", "\n".join(f"- {k}: {v}" for k, v in {
        "target": result["target"], "drafter": result["drafter"],
        "drafter_untrained": result.get("drafter_untrained", False), **cfg}.items()))]
    for suite, summary in result["suites"].items():
        if suite == "all" and len(result["suites"]) == 2:
            continue  # one suite: "all" is the same table
        timed = (f", in real time at time scale {cfg['time_scale']}"
                 if cfg.get("real_time") else "")
        sections.append((f"Suite {suite} (measured on this machine{timed})",
                         report.markdown_table(*table_rows(summary))))
    stage_rows = [[n, *(f"{v:.1f}" for v in s["stage_ms_median"].values())]
                  for n, s in overall.items() if s.get("stage_ms_median")]
    if stage_rows:
        stages = list(next(iter(overall.values()))["stage_ms_median"])
        sections.append(("Stage breakdown (median ms per step, all suites)",
                         report.markdown_table(["method", *stages], stage_rows)))
    progress_rows = [[n, *(f"{v:.2f}" for v in s["first_goal_progress"].values())]
                     for n, s in overall.items() if s.get("first_goal_progress")]
    if progress_rows:
        stages = list(next(s for s in overall.values()
                           if s.get("first_goal_progress"))["first_goal_progress"])
        sections.append(("How far episodes got (fraction, first goal object, all suites)",
                         report.markdown_table(["method", *stages], progress_rows)))
    late = late_rows(overall)
    if late[1]:
        sections.append(("Where the world time goes, by kind of decision (all suites)",
                         report.markdown_table(*late)))
    sections.append(("Who checked each executed action, and what it cost",
                     report.markdown_table(*checks_rows(result["suites"]))))
    sections.append(("Projection", report.projection_markdown(result["projection"])))
    md = report.write_markdown(out / "report.md", "heisd-eval report", sections, images)
    return {"markdown": str(md), **{Path(i).stem: str(i) for i in images}}
