"""Open-loop replay: every method decodes every recorded frame; per-frame and total metrics.

The method order rotates per frame (as in the bench) so machine-load drift hits all methods
alike. AR is always decoded and is the reference of agreement and speed-up. Each method decodes
through a :class:`~heisd_ros.eval.methods.DecoderPolicy`, as in closed loop, so its gripper
state (for the target's gripper rule) is its own previous decision.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from heisd_ros.data.observation import Observation
from heisd_ros.eval import metrics
from heisd_ros.eval.methods import DecoderPolicy

#: Called after every frame with the number of frames done.
FrameCallback = Callable[[int], None]


def replay_frames(decoders: dict, frames: Iterable[Observation],
                  progress: FrameCallback | None = None, task: str | None = None) -> list[dict]:
    """Decode each frame with every decoder (``decoders`` must contain "ar").

    ``task`` is the retrieval DB collection hybrid decoders query (None: the instruction).

    Returns:
        One record per frame: frame index, stamp, EE position (m or None) and, per method,
        the :func:`~heisd_ros.eval.methods.step_record` plus its agreement with AR on this
        frame (exact-token rate, max bin deviation, translation error mm, gripper agreement)
        and its speed-up vs AR on this frame.
    """
    if "ar" not in decoders:
        raise ValueError(f"decoders: 'ar' is the reference and must be included, got "
                         f"{sorted(decoders)}")
    names = list(decoders)
    # As in closed loop, each method's gripper state is its own previous decision (the target's
    # gripper rule needs one; unknown at the first frame).
    policies = {n: DecoderPolicy(decoder, task) for n, decoder in decoders.items()}
    for policy in policies.values():
        policy.reset()
    out = []
    for i, obs in enumerate(frames):
        shift = i % len(names)
        steps = {n: policies[n].act(obs)[1] for n in names[shift:] + names[:shift]}
        ref = steps["ar"]
        for step in steps.values():
            dev = np.abs(np.subtract(step["bins"], ref["bins"]))
            err = np.subtract(step["action"][:3], ref["action"][:3])
            step["agreement"] = {
                "exact_token_rate": float((dev == 0).mean()), "max_bin_deviation": int(dev.max()),
                "translation_error_mm": float(np.linalg.norm(err) * 1e3),
                "gripper_agrees": (step["action"][6] >= 0.5) == (ref["action"][6] >= 0.5),
                "speedup_vs_ar": ref["stage_ms"]["total"] / max(step["stage_ms"]["total"], 1e-9)}
        ee = obs.extras.get("ee_position_m")
        out.append({"frame": i, "stamp_s": obs.stamp_s,
                    "ee_position_m": None if ee is None else np.asarray(ee, float).tolist(),
                    "methods": {n: steps[n] for n in names}})
        if progress is not None:
            progress(i + 1)
    for policy in policies.values():
        policy.finish_checks()   # heisd_behind: the last frame's check, into its record
    return out


def summarise_replay(frames: list[dict]) -> dict[str, dict]:
    """Total per method: counters, latency, speed-up vs AR and agreement with AR."""
    if not frames:
        return {}
    names = list(frames[0]["methods"])
    ref_ms = [f["methods"]["ar"]["stage_ms"]["total"] for f in frames]
    ref_bins = np.array([f["methods"]["ar"]["bins"] for f in frames])
    ref_actions = np.array([f["methods"]["ar"]["action"] for f in frames])
    summary = {}
    for name in names:
        steps = [f["methods"][name] for f in frames]
        ms = [s["stage_ms"]["total"] for s in steps]
        summary[name] = {
            **metrics.counters_summary(steps),
            "latency": metrics.latency_summary(ms),
            "stage_ms_median": metrics.stage_breakdown(steps),
            "speedup_vs_ar": metrics.speedup(ms, ref_ms),
            "speedup_vs_ar_mean": metrics.speedup_mean(ms, ref_ms),
            **metrics.checks_summary([steps]),
            "agreement_with_ar": metrics.agreement(
                np.array([s["bins"] for s in steps]), ref_bins,
                np.array([s["action"] for s in steps]), ref_actions)}
    return summary


def display_mode(step: dict) -> str:
    """Router mode for plots: "skip" when the step was executed without verification."""
    return "skip" if step["verify_skipped"] else step["router_mode"]


def table_rows(summary: dict[str, dict]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the replay table."""
    header = ["method", "exact tok", "mean |dbin|", "trans err mm", "gripper agr", "AL",
              "fwd/action", "p50 ms", "p99 ms", "speed-up", "router share",
              "checked (before + behind)", "rejected behind"]
    rows = []
    for name, s in summary.items():
        a = s["agreement_with_ar"]
        dev = a["mean_bin_deviation_per_dim"]
        rows.append([name, f"{a['exact_token_rate']:.3f}", f"{sum(dev) / len(dev):.2f}",
                     f"{a['translation_error_mm']['mean']:.2f}", f"{a['gripper_agreement']:.3f}",
                     f"{s['al']:.2f}", f"{s['target_forwards_per_action']:.2f}",
                     f"{s['latency']['p50_ms']:.1f}", f"{s['latency']['p99_ms']:.1f}",
                     f"{s['speedup_vs_ar']:.2f}x",
                     " ".join(f"{m}:{v:.2f}" for m, v in s["router_share"].items()),
                     *_checks_cells(s.get("checks"))])
    return header, rows


def _checks_cells(checks: dict | None) -> list[str]:
    """Checked share, and rejections of checks behind (``heisd_behind``) with bins off."""
    if not checks:
        return ["-", "-"]
    behind = checks["checked_behind"]
    if not behind:
        return [f"{checks['checked_share']:.1%}", "-"]
    rejected = round(checks["behind_rejection_rate"] * behind)
    diff = checks["rejected_bin_difference"]
    return [f"{checks['checked_share']:.1%}",
            f"{rejected}/{behind}" + (f" ({diff['mean']:.0f} bins off)" if rejected else "")]


def write_replay_report(out_dir, result: dict) -> dict[str, str]:
    """Markdown report and PNG plots of a replay result; returns {kind: path}."""
    from pathlib import Path

    from heisd_ros.eval import report

    out = Path(out_dir)
    frames, summary = result["frames"], result["methods"]
    names = list(summary)
    traj = {}
    for name in names:
        pts = [(f["ee_position_m"], display_mode(f["methods"][name])) for f in frames
               if f["ee_position_m"] is not None]
        traj[name] = [(np.array([p for p, _ in pts]).reshape(-1, 3), [m for _, m in pts])]
    images = [
        report.plot_trajectories(out / "trajectories.png", traj,
                                 "recorded EE path, coloured by each method's router mode"),
        report.plot_latency(out / "latency_per_step.png",
                            {n: [f["methods"][n]["stage_ms"]["total"] for f in frames]
                             for n in names}, "decode latency per frame"),
        report.plot_accepted_lengths(out / "accepted_length_hist.png",
                                     {n: [k for f in frames
                                          for k in f["methods"][n]["accepted_lengths"]]
                                      for n in names}, "accepted length per round"),
        report.plot_quality_vs_speed(
            out / "agreement_vs_speedup.png",
            {n: (s["speedup_vs_ar"], s["agreement_with_ar"]["exact_token_rate"],
                 s["agreement_with_ar"]["exact_token_rate"],
                 s["agreement_with_ar"]["exact_token_rate"]) for n, s in summary.items()},
            "exact-token agreement with AR", "agreement vs speed-up")]
    header, rows = table_rows(summary)
    per_frame = [[str(f["frame"]), f"{f['stamp_s']:.3f}"]
                 + [f"{f['methods'][n]['agreement']['exact_token_rate']:.2f} / "
                    f"{f['methods'][n]['target_forwards']} / "
                    f"{f['methods'][n]['stage_ms']['total']:.1f} / "
                    f"{f['methods'][n]['agreement']['speedup_vs_ar']:.2f}x / "
                    f"{display_mode(f['methods'][n])}" for n in names]
                 for f in frames[:200]]
    sections = [
        ("Setup", f"- bag: `{result['bag']}` ({result['storage']}, {len(frames)} frames)\n"
                  f"- instruction: {result['instruction']!r}\n- target: {result['target']}\n"
                  f"- drafter: {result['drafter']}\n"
                  f"- drafter_untrained: {result.get('drafter_untrained', False)}\n"
                  f"- topics: {result['topics']}\n"
                  + (f"- {result['pairing']['line']}\n" if "pairing" in result else "")
                  + "".join(f"- **warning:** {w}\n" for w in result.get("warnings", []))),
        ("Total (agreement and speed-up vs AR, measured on this machine)",
         report.markdown_table(header, rows)),
        ("Projection", report.projection_markdown(result["projection"])),
        ("Per frame (exact-token rate / target forwards / ms / speed-up / router mode; "
         "first 200)",
         report.markdown_table(["frame", "stamp s", *names], per_frame))]
    md = report.write_markdown(out / "report.md", "heisd-replay report", sections, images)
    return {"markdown": str(md), **{Path(i).stem: str(i) for i in images}}
