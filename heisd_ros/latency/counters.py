"""What one decision computed: the counters a latency profile prices.

Filled by the decoders into ``StepStats`` (``heisd_ros.decoding.stats``) and carried in every
step record (``counters``), so a decision can be priced after the fact by any profile.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DecisionCounters:
    """Counters of one decision (one 7-token action).

    Attributes:
        vision: observations encoded (0 or 1).
        forwards: target forwards in order, each (context tokens, draft-tree tokens); the
            first is the prefill (its context is the prompt), the others decode or verify
            (context usually 1: the pending token).
        drafter_forwards: draft-head forwards.
        draft_calls: draft proposals (draft-head or retrieval trees built).
        retrievals: vector-DB queries.
        unverified: the action ran without a target forward.
        check: (context tokens, tree tokens) of the check behind this decision started on its
            own action, None when none.
        collects_verdict: the decision needed the previous check's verdict before it could
            decide (it wanted to run unverified).
        check_from_cache: the check continues the decision's own decode state (a
            ``deadline`` check: a decode forward over the unverified tokens), priced as a
            forward, not a prefill.
    """

    vision: int = 0
    forwards: tuple[tuple[int, int], ...] = ()
    drafter_forwards: int = 0
    draft_calls: int = 0
    retrievals: int = 0
    unverified: bool = False
    check: tuple[int, int] | None = None
    collects_verdict: bool = False
    check_from_cache: bool = False

    def __post_init__(self) -> None:
        pairs = tuple((int(c), int(t)) for c, t in self.forwards)
        if any(c < 0 or t < 0 for c, t in pairs):
            raise ValueError(f"forwards: expected (context, tree) token counts >= 0, got "
                             f"{self.forwards}")
        object.__setattr__(self, "forwards", pairs)
        if self.check is not None:
            object.__setattr__(self, "check", (int(self.check[0]), int(self.check[1])))
        for name in ("vision", "drafter_forwards", "draft_calls", "retrievals"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: expected a count >= 0, got {getattr(self, name)}")

    @property
    def target_forwards(self) -> int:
        """Target forwards of the decision (AR: 7)."""
        return len(self.forwards)

    def to_dict(self) -> dict:
        """JSON-friendly (what a step record's ``counters`` holds)."""
        return {"vision": self.vision, "forwards": [list(f) for f in self.forwards],
                "drafter_forwards": self.drafter_forwards, "draft_calls": self.draft_calls,
                "retrievals": self.retrievals, "unverified": self.unverified,
                "check": list(self.check) if self.check is not None else None,
                "collects_verdict": self.collects_verdict,
                "check_from_cache": self.check_from_cache}

    @classmethod
    def from_dict(cls, data: dict) -> DecisionCounters:
        """From :meth:`to_dict`'s form."""
        check = data.get("check")
        return cls(vision=int(data.get("vision", 0)),
                   forwards=tuple(tuple(f) for f in data.get("forwards", ())),
                   drafter_forwards=int(data.get("drafter_forwards", 0)),
                   draft_calls=int(data.get("draft_calls", 0)),
                   retrievals=int(data.get("retrievals", 0)),
                   unverified=bool(data.get("unverified", False)),
                   check=tuple(check) if check is not None else None,
                   collects_verdict=bool(data.get("collects_verdict", False)),
                   check_from_cache=bool(data.get("check_from_cache", False)))

    @classmethod
    def from_stats(cls, stats) -> DecisionCounters:
        """From a decoder's ``StepStats``."""
        return cls(vision=stats.vision_calls, forwards=tuple(stats.forward_tokens),
                   drafter_forwards=stats.drafter_forwards, draft_calls=stats.draft_calls,
                   retrievals=stats.retrieval_calls, unverified=not stats.forward_tokens,
                   check=stats.check_tokens, collects_verdict=stats.collected_verdict,
                   check_from_cache=stats.check_from_cache)
