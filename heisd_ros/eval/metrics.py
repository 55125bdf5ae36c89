"""Pure metrics of an evaluation: success intervals, latencies, counters, agreement with AR.

Everything here works on plain numbers and numpy arrays (no torch, no simulator), so the
closed-loop evaluation and the open-loop bag replay share one definition of each metric.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from heisd_ros.actions.groups import ACTION_GROUPS, group_of_dim
from heisd_ros.decoding.unverified import RULE_DEADLINE

#: Normal quantile of a two-sided 95% interval.
Z_95 = 1.959963984540054


def wilson_interval(successes: int, trials: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval of a success rate (default 95%).

    Args:
        successes: number of successful trials, 0..trials.
        trials: number of trials; 0 gives (0.0, 1.0), no information.
        z: normal quantile of the interval.

    Returns:
        (low, high) as fractions in [0, 1].
    """
    if trials < 0 or not 0 <= successes <= max(trials, 0):
        raise ValueError(f"successes/trials: expected 0 <= successes <= trials, got "
                         f"{successes}/{trials}")
    if trials == 0:
        return 0.0, 1.0
    p = successes / trials
    denom = 1.0 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def latency_summary(ms: Sequence[float]) -> dict[str, float]:
    """Median, p90, p99 and mean of latencies in ms (NaN for an empty list)."""
    arr = np.asarray(ms, dtype=np.float64)
    if arr.size == 0:
        return dict.fromkeys(("p50_ms", "p90_ms", "p99_ms", "mean_ms"), float("nan"))
    return {"p50_ms": float(np.median(arr)), "p90_ms": float(np.percentile(arr, 90)),
            "p99_ms": float(np.percentile(arr, 99)), "mean_ms": float(arr.mean())}


def counters_summary(steps: Sequence[dict]) -> dict[str, float]:
    """Mean work per action over step records (see :func:`heisd_ros.eval.methods.step_record`).

    AL is pooled over all verification rounds (bonus token included, EAGLE convention); 1.0
    when no draft was ever verified. ``skip_rate`` is the share of actions executed without a
    target forward; ``router_share`` the share of each router mode ("off" for methods
    without a router).
    """
    if not steps:
        return {}
    rounds = [n for s in steps for n in s["accepted_lengths"]]
    modes: dict[str, int] = {}
    for s in steps:
        modes[s["router_mode"]] = modes.get(s["router_mode"], 0) + 1

    def mean(key: str) -> float:
        return float(np.mean([s[key] for s in steps]))

    return {"actions": len(steps), "al": float(np.mean(rounds)) if rounds else 1.0,
            "target_forwards_per_action": mean("target_forwards"),
            "drafter_forwards_per_action": mean("drafter_forwards"),
            "retrievals_per_action": mean("retrieval_calls"),
            "skip_rate": float(np.mean([bool(s["verify_skipped"]) for s in steps])),
            "draft_tokens_per_action": mean("tokens_from_draft"),
            "router_share": {m: c / len(steps) for m, c in sorted(modes.items())}}


def unverified_summary(episodes: Sequence[Sequence[dict]]) -> dict:
    """Unverified (target-free) steps over episodes of step records, in order.

    Returns ``unverified_share`` (of all actions), ``longest_unverified_run`` (steps in a
    row), ``unverified_by_rule`` (share of actions per ``skip_rule``) and, over the verified
    steps that follow one or more unverified ones, ``after_skip`` = how far the target's action
    is from the last unverified one: ``count``, ``exact_action_rate`` (all 7 bins equal),
    ``mean_bin_deviation`` (mean |bin difference| over the 6 arm dimensions) and
    ``gripper_agreement``.
    """
    steps = [s for episode in episodes for s in episode]
    if not steps:
        return {}
    by_rule: dict[str, int] = {}
    longest, pairs = 0, []
    for episode in episodes:
        run = 0
        for previous, step in zip([None, *episode[:-1]], episode, strict=True):
            if step["verify_skipped"]:
                run += 1
                rule = (step.get("hybrid") or {}).get("skip_rule") or "similarity"
                by_rule[rule] = by_rule.get(rule, 0) + 1
                longest = max(longest, run)
                continue
            if run and previous is not None:
                pairs.append((previous["bins"], step["bins"]))
            run = 0
    after: dict = {"count": len(pairs)}
    if pairs:
        last, verified = (np.asarray(x, dtype=np.int64) for x in zip(*pairs, strict=True))
        after.update(exact_action_rate=float(np.mean(np.all(last == verified, axis=1))),
                     mean_bin_deviation=float(np.mean(np.abs(last[:, :6] - verified[:, :6]))),
                     gripper_agreement=float(np.mean(last[:, 6] == verified[:, 6])))
    return {"unverified_share": sum(by_rule.values()) / len(steps),
            "longest_unverified_run": longest,
            "unverified_by_rule": {k: v / len(steps) for k, v in sorted(by_rule.items())},
            "after_skip": after}


def checks_summary(episodes: Sequence[Sequence[dict]]) -> dict:
    """Who checked the executed actions, and what checking cost, over episodes of steps.

    Every executed action is either verified before it ran (the target decoded or verified
    it), checked behind (``heisd_behind``: the step record holds the verdict under
    ``behind``; ``heisd_deadline``'s completed steps too, their first tokens verified before),
    or never checked. Returns ``checks`` with ``actions``, ``verified_before``,
    ``checked_behind``, ``completed_at_deadline`` (steps completed at the forward budget),
    ``unchecked``, ``checked_share`` (before or behind, of all actions),
    ``behind_rejection_rate`` and per rule
    (``behind_by_rule``: {rule: {checks, rejected, rejection_rate}}),
    ``rejected_bin_difference`` (mean and max sum of |bin differences| of rejected actions),
    ``rejected_at`` (rejections by the group of their first refused dimension: position,
    rotation, gripper; the rules keep the executed gripper state, so a gripper rejection is
    another bin of that state or the target wanting the gripper to change),
    ``waited`` (collected checks the next step had to wait for, > 0.1 ms) and
    ``wait_ms_mean`` over those; and the honest costs per action: ``vla_forwards_per_action``
    (target forwards including checks behind) and ``cpu_ms_per_action`` (CPU time of the
    deciding thread plus the check's thread). None where there is nothing to average (JSON
    keeps it; NaN would not compare equal after a round trip).
    """
    steps = [s for episode in episodes for s in episode]
    if not steps:
        return {}
    behind = [s["behind"] for s in steps if s.get("behind")]
    skipped = [s for s in steps if s["verify_skipped"]]
    by_rule: dict[str, dict] = {}
    for check in behind:
        entry = by_rule.setdefault(check["rule"] or "?", {"checks": 0, "rejected": 0})
        entry["checks"] += 1
        entry["rejected"] += int(not check["confirmed"])
    for entry in by_rule.values():
        entry["rejection_rate"] = entry["rejected"] / entry["checks"]
    refused = [c for c in behind if not c["confirmed"]]
    rejected = [c["bin_difference"] for c in refused]
    at = dict.fromkeys(ACTION_GROUPS, 0)
    for c in refused:
        at[group_of_dim(int(c["first_rejected_dim"]))] += 1
    waits = [float((s.get("hybrid") or {}).get("behind_wait_ms") or 0.0) for s in steps
             if (s.get("hybrid") or {}).get("behind_result")]
    waited = [w for w in waits if w > 0.1]
    forwards = [s["target_forwards"] + (1 if s.get("behind") else 0) for s in steps]
    cpu = [s["cpu_ms"] + (s["behind"]["cpu_ms"] if s.get("behind") else 0.0)
           for s in steps if "cpu_ms" in s]
    # A ``deadline`` step ran target forwards, but its last tokens only get checked behind.
    completed = [s for s in steps if not s["verify_skipped"]
                 and (s.get("hybrid") or {}).get("skip_rule") == RULE_DEADLINE]
    behind_steps = skipped + completed
    checked_behind = sum(1 for s in behind_steps if s.get("behind"))
    verified = len(steps) - len(behind_steps)
    return {"checks": {
        "actions": len(steps), "verified_before": verified, "checked_behind": checked_behind,
        "completed_at_deadline": len(completed),
        "unchecked": len(behind_steps) - checked_behind,
        "checked_share": (verified + checked_behind) / len(steps),
        "behind_rejection_rate": len(rejected) / len(behind) if behind else None,
        "behind_by_rule": dict(sorted(by_rule.items())),
        "rejected_bin_difference": {"mean": float(np.mean(rejected)) if rejected else None,
                                    "max": int(max(rejected)) if rejected else 0},
        "rejected_at": at,
        "collected": len(waits), "waited": len(waited),
        "wait_ms_mean": float(np.mean(waited)) if waited else 0.0},
        "vla_forwards_per_action": float(np.mean(forwards)),
        "cpu_ms_per_action": float(np.mean(cpu)) if cpu else None}


def stage_breakdown(steps: Sequence[dict]) -> dict[str, float]:
    """Median ms per stage over step records (keys as in ``StepStats.stage_ms``)."""
    if not steps:
        return {}
    return {stage: float(np.median([s["stage_ms"].get(stage, 0.0) for s in steps]))
            for stage in steps[0]["stage_ms"]}


def agreement(bins: np.ndarray, ref_bins: np.ndarray, actions: np.ndarray | None = None,
              ref_actions: np.ndarray | None = None) -> dict:
    """Agreement of a method's actions with the reference (AR) actions on the same frames.

    Args:
        bins: (N, 7) action bins 0..255 of the method.
        ref_bins: (N, 7) action bins of the reference.
        actions: (N, 7) physical actions (m, rad, gripper 0/1) of the method; needed for the
            translation error and gripper agreement.
        ref_actions: (N, 7) physical actions of the reference.

    Returns:
        exact_token_rate (share of equal bins), exact_action_rate (share of frames with all 7
        equal), mean_bin_deviation_per_dim (7 floats), translation_error_mm (mean and max
        Euclidean distance of dx, dy, dz), gripper_agreement (share of equal gripper states).
    """
    bins, ref_bins = np.atleast_2d(bins), np.atleast_2d(ref_bins)
    if bins.shape != ref_bins.shape or bins.shape[-1] != 7:
        raise ValueError(f"bins: expected matching (N, 7) arrays, got {bins.shape} and "
                         f"{ref_bins.shape}")
    dev = np.abs(bins.astype(np.int64) - ref_bins.astype(np.int64))
    out = {"frames": int(len(bins)), "exact_token_rate": float((dev == 0).mean()),
           "exact_action_rate": float((dev == 0).all(axis=1).mean()),
           "mean_bin_deviation_per_dim": dev.mean(axis=0).tolist()}
    if actions is not None and ref_actions is not None:
        actions, ref_actions = np.atleast_2d(actions), np.atleast_2d(ref_actions)
        err_mm = np.linalg.norm(actions[:, :3] - ref_actions[:, :3], axis=1) * 1e3
        out["translation_error_mm"] = {"mean": float(err_mm.mean()), "max": float(err_mm.max())}
        out["gripper_agreement"] = float(np.mean((actions[:, 6] >= 0.5)
                                                 == (ref_actions[:, 6] >= 0.5)))
    return out


def speedup(ms: Sequence[float], ref_ms: Sequence[float]) -> float:
    """Ratio of median latencies, reference over method (>1 = the method is faster)."""
    if len(ms) == 0 or len(ref_ms) == 0:
        return float("nan")
    return float(np.median(ref_ms)) / float(np.median(ms))


def speedup_mean(ms: Sequence[float], ref_ms: Sequence[float]) -> float:
    """Ratio of mean latencies, reference over method: the control rate over a whole run.

    Differs from :func:`speedup` when a method's latency is bimodal (one target forward on an
    accepted retrieval draft, several on a rejected one): the median then shows the fast mode.
    """
    if len(ms) == 0 or len(ref_ms) == 0:
        return float("nan")
    return float(np.mean(ref_ms)) / float(np.mean(ms))


def first_goal_progress(progress: Sequence[dict]) -> dict[str, float]:
    """Fraction of episodes whose first goal object reached each stage.

    ``progress`` holds one ``{object: {stage: bool}}`` per episode (``heisd_ros.sim.progress``);
    episodes without one are left out; {} when none has one.
    """
    firsts = [next(iter(p.values())) for p in progress if p]
    if not firsts:
        return {}
    return {stage: sum(bool(f[stage]) for f in firsts) / len(firsts) for stage in firsts[0]}


def real_time_summary(world_times_s: Sequence[float], commands: Sequence[int],
                      steps: Sequence[dict], successes: Sequence[bool] | None = None) -> dict:
    """Timing of real-time episodes (``heisd_ros.sim.runner.RealTime``).

    Args:
        world_times_s: world time each episode took (s).
        commands: commands each episode applied.
        steps: the step records of all those episodes, with ``rt_world_latency_ms`` and
            ``rt_late``.
        successes: whether each episode succeeded (optional).

    Returns:
        ``real_time`` with ``command_rate_hz`` (commands per world second, mean over
        episodes), ``command_age_ms`` (``p50``, ``p99``: world time from a decision's frame
        to its command), ``late_share`` (of commands later than a control period) and
        ``world_time_s_mean``; with ``successes`` (one per episode) also
        ``world_time_to_success_s_mean``; at a latency profile also ``device_wait_ms_mean``
        and ``device_waits`` (decisions that waited for a check behind holding the device);
        ``by_step_kind`` (:func:`real_time_by_kind`); None where there is nothing to average
        (JSON keeps it).
    """
    if len(world_times_s) != len(commands):
        raise ValueError(f"world_times_s/commands: expected one of each per episode, got "
                         f"{len(world_times_s)} and {len(commands)}")
    rates = [n / t for n, t in zip(commands, world_times_s, strict=True) if t > 0]
    ages = np.asarray([s["rt_world_latency_ms"] for s in steps], dtype=np.float64)
    summary = {"real_time": {
        "command_rate_hz": float(np.mean(rates)) if rates else None,
        "command_age_ms": {"p50": float(np.median(ages)) if ages.size else None,
                           "p99": float(np.percentile(ages, 99)) if ages.size else None},
        "late_share": float(np.mean([bool(s["rt_late"]) for s in steps])) if steps else None,
        "world_time_s_mean": float(np.mean(world_times_s)) if len(world_times_s) else None}}
    out = summary["real_time"]
    if successes is not None:
        won = [t for t, ok in zip(world_times_s, successes, strict=True) if ok]
        out["world_time_to_success_s_mean"] = float(np.mean(won)) if won else None
    waits = [s["rt_device_wait_ms"] for s in steps if "rt_device_wait_ms" in s]
    if waits:
        out["device_waits"] = int(sum(w > 0 for w in waits))
        out["device_wait_ms_mean"] = float(np.mean(waits))
    out["by_step_kind"] = real_time_by_kind(steps)
    return summary


#: Step kinds of :func:`step_kind`, in the order reports list them.
STEP_KINDS: tuple[str, ...] = (
    "unverified", "completed at the deadline", "retrieval draft, one forward",
    "retrieval draft, more forwards", "draft head", "AR")


def step_kind(step: dict) -> str:
    """What kind of decision a step record was (one of :data:`STEP_KINDS`).

    ``unverified``: executed without a target forward; ``completed at the deadline``:
    ``heisd_deadline`` completed it after its forward budget; ``retrieval draft, one
    forward`` / ``more forwards``: verified with a retrieval draft in the prefill, accepted
    whole (one target forward) or not; ``draft head``: verified with the draft head's trees
    only; ``AR``: no draft at all.
    """
    if step.get("verify_skipped"):
        return "unverified"
    if (step.get("hybrid") or {}).get("skip_rule") == RULE_DEADLINE:
        return "completed at the deadline"
    source = step.get("draft_source") or ""
    if "retrieval" in source:
        return ("retrieval draft, one forward" if step.get("target_forwards") == 1
                else "retrieval draft, more forwards")
    return "draft head" if "drafter" in source else "AR"


def real_time_by_kind(steps: Sequence[dict]) -> dict[str, dict]:
    """Real-time steps by :func:`step_kind`: where late decisions come from.

    Per kind present: ``steps``, ``share`` (of all steps), ``late_share`` (of that kind's
    commands later than a control period), ``command_age_ms_mean`` and ``period_ms_mean``
    (world time from the decision's start to the next's, None without a next: what the kind
    costs the episode).
    """
    kinds: dict[str, list[dict]] = {}
    for s in steps:
        kinds.setdefault(step_kind(s), []).append(s)
    out = {}
    for kind in STEP_KINDS:
        items = kinds.get(kind)
        if not items:
            continue
        periods = [s["rt_period_ms"] for s in items if s.get("rt_period_ms") is not None]
        out[kind] = {
            "steps": len(items), "share": len(items) / len(steps),
            "late_share": float(np.mean([bool(s["rt_late"]) for s in items])),
            "command_age_ms_mean": float(np.mean([s["rt_world_latency_ms"] for s in items])),
            "period_ms_mean": float(np.mean(periods)) if periods else None}
    return out
