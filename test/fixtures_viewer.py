"""HybridStep fields of each step kind, and a bag of them (``heisd-view`` tests)."""

from __future__ import annotations

from pathlib import Path

from heisd_ros.decoding.interface import (
    BEHIND_CONFIRMED,
    BEHIND_REJECTED,
    DRAFT_DRAFTER,
    DRAFT_NONE,
    DRAFT_RETRIEVAL,
    ROUTER_DRAFTER,
    ROUTER_OFF,
    ROUTER_RETRIEVAL,
    HybridStepRecord,
)
from test.fixtures_demos import synth_episode


def step_fields(draft_source=DRAFT_NONE, router=ROUTER_OFF, skipped=False, behind=False,
                verdict=0, total_ms=10.0, rounds=(), fused=float("nan"), status="") -> dict:
    """The HybridStep fields of one step (as a received message's)."""
    record = HybridStepRecord(router_mode=router, draft_source=draft_source,
                              verify_skipped=skipped, unverified_run=int(skipped or behind),
                              checked_behind=behind, behind_result=verdict,
                              accepted_length_per_round=list(rounds), fused_metric=fused,
                              action_bins=[128] * 7, action=[0.0] * 7, status=status)
    fields = record.to_msg_fields()
    fields["total_ms"] = total_ms
    return fields


#: One step of each kind, in order: the checks behind get their verdicts from their successor.
STEPS = [
    step_fields(total_ms=70.0),                                                # ar
    step_fields(DRAFT_DRAFTER, ROUTER_DRAFTER, rounds=(3, 2), fused=0.2),      # drafter
    step_fields(DRAFT_RETRIEVAL, ROUTER_RETRIEVAL, rounds=(7,), fused=0.8),    # retrieval
    step_fields(DRAFT_RETRIEVAL, ROUTER_RETRIEVAL, skipped=True, fused=0.9),   # unverified
    step_fields(DRAFT_RETRIEVAL, ROUTER_RETRIEVAL, skipped=True, behind=True),  # confirmed
    step_fields(DRAFT_RETRIEVAL, ROUTER_RETRIEVAL, skipped=True, behind=True,
                verdict=BEHIND_CONFIRMED),                                     # rejected
    step_fields(DRAFT_DRAFTER, ROUTER_DRAFTER, verdict=BEHIND_REJECTED, rounds=(1,),
                status="retrieval timeout: drafter mode"),                     # drafter
    step_fields(DRAFT_RETRIEVAL, ROUTER_RETRIEVAL, skipped=True, behind=True),  # pending
]
#: The resolved kind of each of :data:`STEPS`.
KINDS = ["ar", "drafter", "retrieval", "unverified", "behind_confirmed", "behind_rejected",
         "drafter", "behind_pending"]


def bag_of(folder: Path, steps: list[dict]):
    """A heisd-record bag of a synthetic episode with ``steps``; (its record, its path)."""
    from heisd_ros.eval.recording import write_run_bag

    record = synth_episode("task_a", 7, steps=len(steps))
    sources = {DRAFT_NONE: "", DRAFT_DRAFTER: "drafter", DRAFT_RETRIEVAL: "retrieval"}
    records = [{"hybrid": f, "verify_skipped": f["verify_skipped"],
                "draft_source": sources[f["draft_source"]]} for f in steps]
    return record, write_run_bag(record, records, folder / "episode_bag")
