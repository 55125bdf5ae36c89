"""Side-by-side decoding benchmark (library part of ``heisd-bench``).

All modes run in one process on the same observations after warm-up, interleaved (the mode
order rotates per observation so drift in machine load hits every mode alike). Speed-up is
the ratio of median wall-clock per action against the AR mode of the same run.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from heisd_ros.data.observation import ACTION_DIM, Observation
from heisd_ros.decoding.interface import (
    DRAFT_RETRIEVAL,
    ROUTER_OFF,
    ROUTER_RETRIEVAL,
    ActionResult,
    Decoder,
)
from heisd_ros.decoding.stats import STAGES


@dataclass(frozen=True)
class BenchRecord:
    """One decoded action of one mode (``index`` = observation number)."""

    mode: str
    index: int
    result: ActionResult


def run_interleaved(modes: dict[str, Decoder],
                    observations: Sequence[Observation],
                    warmup: Sequence[Observation] = ()) -> list[BenchRecord]:
    """Decode every observation with every mode, rotating the mode order per observation.

    Each mode first decodes the ``warmup`` observations; those are not recorded.
    """
    names = list(modes)
    for obs in warmup:
        for name in names:
            modes[name].decode(obs)
    records = []
    for i, obs in enumerate(observations):
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            records.append(BenchRecord(name, i, modes[name].decode(obs)))
    return records


def summarise(records: list[BenchRecord], reference: str = "ar") -> dict[str, dict]:
    """Per-mode metrics of a bench run.

    Target forwards per action, AL, ms per action (median, p90), speed-up against the
    ``reference`` mode and agreement with it (exact-token rate, mean |bin difference| per dim).
    """
    by_mode: dict[str, dict[int, ActionResult]] = {}
    for r in records:
        by_mode.setdefault(r.mode, {})[r.index] = r.result
    if reference not in by_mode:
        raise ValueError(f"reference: mode {reference!r} not among {sorted(by_mode)}")
    ref_ms = float(np.median([r.stats.stage_ms["total"] for r in by_mode[reference].values()]))
    summary = {}
    for mode, results in by_mode.items():
        ordered = [results[i] for i in sorted(results)]
        ms = np.array([r.stats.stage_ms["total"] for r in ordered])
        rounds = [n for r in ordered for n in r.stats.accepted_lengths]
        ref_bins = np.stack([by_mode[reference][i].bins for i in sorted(results)])
        bins = np.stack([r.bins for r in ordered])
        deviation = np.abs(bins - ref_bins)
        def mean_of(field: str, results=ordered) -> float:
            return float(np.mean([getattr(r.stats, field) for r in results]))

        summary[mode] = {
            "actions": len(ordered),
            "target_forwards_per_action": mean_of("target_forwards"),
            "drafter_forwards_per_action": mean_of("drafter_forwards"),
            "al": float(np.mean(rounds)) if rounds else 1.0,
            "draft_tokens_per_action": mean_of("tokens_from_draft"),
            "ms_per_action": {"median": float(np.median(ms)), "p90": float(np.percentile(ms, 90))},
            "stage_ms_median": {s: float(np.median([r.stats.stage_ms[s] for r in ordered]))
                                for s in STAGES},
            "speedup_vs_ar": ref_ms / float(np.median(ms)),
            "agreement_with_ar": {
                "exact_token_rate": float((deviation == 0).mean()),
                "exact_action_rate": float((deviation == 0).all(axis=1).mean()),
                "mean_bin_deviation_per_dim": deviation.mean(axis=0).tolist()},
        }
        paths = [r.record for r in ordered]
        if all(p is not None for p in paths):  # HybridDecoder results: which path, how often
            routed = [p.router_mode for p in paths if p.router_mode != ROUTER_OFF]
            summary[mode]["hybrid"] = {
                "skip_rate": float(np.mean([p.verify_skipped for p in paths])),
                "router_retrieval_share": float(np.mean([m == ROUTER_RETRIEVAL for m in routed]))
                if routed else None,
                "retrieval_draft_share": float(np.mean([p.draft_source == DRAFT_RETRIEVAL
                                                        for p in paths])),
                "degraded_rate": float(np.mean([bool(p.status) for p in paths]))}
    return summary


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


@torch.no_grad()
def cost_profile(target, head, observation: Observation, tree_nodes: int = 16,
                 draft_nodes: int = 4, repeats: int = 20) -> dict[str, float]:
    """Median ms of each building block on one observation, and the ratios that matter.

    The ratios are draft-head forward / target decode forward and vision / AR action.
    """
    from heisd_ros.models.draft_tree import DraftTree

    prefix = target.encode(observation)
    vision_ms = _median_ms(lambda: target.encode(observation), repeats)

    def prefill():
        state = target.start(prefix)
        out = target.forward(state)
        target.commit(state, out, [], int(target.actions.argmax_token(out.last_logits)))
        return state

    prefill_ms = _median_ms(prefill, repeats)
    state = prefill()
    ids = target.actions.token_of_bin(np.arange(tree_nodes) % 256)

    def one_forward(tree):
        # Public API only: the pending token is kept and the tree dropped, so the cache grows
        # by one position per call (negligible next to the prompt).
        out = target.forward(state, tree)
        target.commit(state, out, [], int(target.actions.argmax_token(out.last_logits)))

    decode_ms = _median_ms(lambda: one_forward(DraftTree.empty()), repeats)
    tree_ms = _median_ms(lambda: one_forward(DraftTree.chain(ids)), repeats)
    h = target.hidden_size
    x = torch.randn(1, draft_nodes, h, device=target.device, dtype=prefix.embeds.dtype)
    pos = torch.arange(draft_nodes, device=target.device)[None]
    head_ms = _median_ms(lambda: head(x, x, pos), repeats)
    ar_ms = vision_ms + prefill_ms + (ACTION_DIM - 1) * decode_ms
    return {"prompt_tokens": prefix.embeds.shape[1], "vision_ms": vision_ms,
            "prefill_ms": prefill_ms, "decode_forward_ms": decode_ms,
            f"tree{tree_nodes}_forward_ms": tree_ms, f"draft_head_{draft_nodes}_nodes_ms": head_ms,
            "draft_over_target_forward": head_ms / decode_ms, "ar_action_ms_estimate": ar_ms,
            "vision_share_of_ar": vision_ms / ar_ms}
