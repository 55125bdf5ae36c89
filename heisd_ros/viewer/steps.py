"""What each control step was, for a viewer: its kind, colour, scalars and status line.

A step is described by its HybridStep fields (``msg/HybridStep.msg`` names, as a dict: a
received message's, a bag's, or :func:`heisd_ros.eval.recording.hybrid_step_fields` of an
evaluation's step record). Its kind says where the executed action came from:

- ``ar``: the target decoded it token by token (no draft);
- ``drafter``: the draft head drafted it and the target verified it;
- ``retrieval``: the retrieval DB drafted it and the target verified it;
- ``unverified``: the retrieval draft ran without the target;
- ``behind_pending`` / ``behind_confirmed`` / ``behind_rejected``: it ran without the target
  while the target checked it on the side (``heisd_behind``). The verdict arrives with the
  *next* step (its ``behind_result``), so a step's kind can change once its successor is
  known: :func:`step_kinds` resolves it over a sequence.

Pure: no Rerun, no ROS.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from heisd_ros.decoding.interface import (
    BEHIND_CONFIRMED,
    BEHIND_REJECTED,
    DRAFT_DRAFTER,
    DRAFT_RETRIEVAL,
    ROUTER_MODE_NAMES,
    ROUTER_OFF,
)

#: Step kinds, in legend order: (name, label, RGB 0..255).
KINDS: tuple[tuple[str, str, tuple[int, int, int]], ...] = (
    ("ar", "AR (no draft)", (150, 150, 150)),
    ("drafter", "drafter, verified", (50, 100, 255)),
    ("retrieval", "retrieval, verified", (30, 200, 60)),
    ("unverified", "retrieval, unverified", (255, 140, 0)),
    ("behind_pending", "checked behind, pending", (230, 210, 40)),
    ("behind_confirmed", "checked behind, confirmed", (0, 200, 200)),
    ("behind_rejected", "checked behind, rejected", (230, 30, 40)),
)
#: kind name -> class id (1-based; 0 is Rerun's "no class").
KIND_IDS = {name: i + 1 for i, (name, _, _) in enumerate(KINDS)}
KIND_COLOURS = {name: colour for name, _, colour in KINDS}


def own_kind(fields: dict | None) -> str:
    """The kind of one step from its own fields (a check behind counts as pending)."""
    if not fields:
        return "ar"
    if fields.get("checked_behind"):
        return "behind_pending"
    if fields.get("verify_skipped") or int(fields.get("unverified_run", 0) or 0) > 0:
        return "unverified"
    source = int(fields.get("draft_source", 0) or 0)
    if source == DRAFT_RETRIEVAL:
        return "retrieval"
    if source == DRAFT_DRAFTER:
        return "drafter"
    return "ar"


def resolve_behind(kind: str, next_fields: dict | None) -> str:
    """A pending check's kind once the next step's fields carry its verdict."""
    if kind != "behind_pending" or not next_fields:
        return kind
    verdict = int(next_fields.get("behind_result", 0) or 0)
    if verdict == BEHIND_CONFIRMED:
        return "behind_confirmed"
    if verdict == BEHIND_REJECTED:
        return "behind_rejected"
    return kind


def step_kinds(steps: Sequence[dict | None]) -> list[str]:
    """The kind of every step of a sequence, checks behind resolved by their successors."""
    kinds = [own_kind(f) for f in steps]
    return [resolve_behind(k, steps[i + 1] if i + 1 < len(steps) else None)
            for i, k in enumerate(kinds)]


def accepted_length(fields: dict | None) -> float:
    """Mean accepted length per verification round (bonus token included); NaN: no round."""
    rounds = list((fields or {}).get("accepted_length_per_round", []) or [])
    return sum(int(r) for r in rounds) / len(rounds) if rounds else math.nan


def step_scalars(fields: dict | None) -> dict[str, float]:
    """Per-step scalars a viewer plots: latency (ms), accepted length, the router's F."""
    fields = fields or {}
    return {"latency_ms": float(fields.get("total_ms", math.nan)),
            "accepted_length": accepted_length(fields),
            "router_F": float(fields.get("fused_metric", math.nan))}


def status_line(index: int, kind: str, fields: dict | None) -> str:
    """One line per step: kind, router mode, F, accepted length and any status text."""
    fields = fields or {}
    router = ROUTER_MODE_NAMES.get(int(fields.get("router_mode", ROUTER_OFF)), "?")
    fused = float(fields.get("fused_metric", math.nan))
    length = accepted_length(fields)
    parts = [f"step {index}", dict((n, lab) for n, lab, _ in KINDS)[kind], f"router {router}",
             "F n/a" if math.isnan(fused) else f"F {fused:.2f}",
             "AL n/a" if math.isnan(length) else f"AL {length:.2f}"]
    status = str(fields.get("status", "") or "")
    if status:
        parts.append(status)
    return " | ".join(parts)
