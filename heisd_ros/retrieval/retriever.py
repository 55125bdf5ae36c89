"""Top-K retrieval drafts with a deadline and a per-episode memory of rejected drafts.

The retrieval node serves :meth:`Retriever.retrieve` (the policy node passes the ids it wants
demoted in the request); a process that holds the DB itself (tests, offline tools, a
single-process policy) lets the retriever's own :class:`DemotionMemory` track rejections.

Why demotion: a retrieved draft that the target rejected tends to come back at the next
steps (similar observations, neighbouring steps of the same demonstration carrying the same
action); ranking it last for a few steps lets the other candidates be tried instead.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from heisd_ros.retrieval.errors import RetrievalStatus, StoreError
from heisd_ros.retrieval.records import Candidate, StepRecord
from heisd_ros.retrieval.store import Hit, VectorStore

DEMOTIONS: tuple[str, ...] = ("rank_last", "penalty")


@dataclass(frozen=True)
class RetrieverConfig:
    """How many drafts to return and how rejected drafts are demoted.

    Attributes:
        k: candidates per step (top-K; the paper's sequence-wise acceptance uses K > 1).
        demote_steps: control steps a rejected candidate stays demoted (0 = never demote).
        demotion: "rank_last" (after every other hit) or "penalty" (cosine score lowered by
            ``demote_penalty`` for ranking; the reported score stays the raw similarity).
        demote_penalty: score penalty for "penalty" mode.
        demote_same_bins: also demote other points carrying the rejected action's exact bins
            (the neighbouring steps of a demonstration often repeat an action).
    """

    k: int = 4
    demote_steps: int = 5
    demotion: str = "rank_last"
    demote_penalty: float = 0.1
    demote_same_bins: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.k <= 256:
            raise ValueError(f"k: expected 1..256, got {self.k}")
        if self.demote_steps < 0:
            raise ValueError(f"demote_steps: expected >= 0, got {self.demote_steps}")
        if self.demotion not in DEMOTIONS:
            raise ValueError(f"demotion: unknown mode {self.demotion!r}; valid: {list(DEMOTIONS)}")
        if not (math.isfinite(self.demote_penalty) and self.demote_penalty >= 0):
            raise ValueError(f"demote_penalty: expected a finite value >= 0, "
                             f"got {self.demote_penalty}")


class DemotionMemory:
    """Which candidates were rejected recently, keyed by control-step index."""

    def __init__(self, demote_steps: int) -> None:
        self.demote_steps = demote_steps
        self._ids: dict[int, int] = {}  # point id -> step of its last rejection
        self._bins: dict[bytes, int] = {}  # action bins -> step of its last rejection

    def reject(self, candidate: Candidate | int, step: int) -> None:
        """Remember that ``candidate`` (or a bare point id) was rejected at ``step``."""
        if isinstance(candidate, Candidate):
            self._ids[candidate.id] = step
            self._bins[candidate.bins.tobytes()] = step
        else:
            self._ids[int(candidate)] = step

    def _active(self, when: int, step: int) -> bool:
        return 0 <= step - when <= self.demote_steps and self.demote_steps > 0

    def active_ids(self, step: int) -> set[int]:
        """Point ids demoted at ``step`` (and forget those expired for good)."""
        self._ids = {i: w for i, w in self._ids.items() if step - w <= self.demote_steps}
        self._bins = {b: w for b, w in self._bins.items() if step - w <= self.demote_steps}
        return {i for i, when in self._ids.items() if self._active(when, step)}

    def active_bins(self, step: int) -> set[bytes]:
        """Rejected actions (bins as bytes) demoted at ``step``."""
        return {b for b, when in self._bins.items() if self._active(when, step)}

    def reset(self) -> None:
        """Forget every rejection."""
        self._ids.clear()
        self._bins.clear()


@dataclass(frozen=True)
class RetrievalResult:
    """Candidates best first, plus a status and, unless OK, the reason for a person."""

    status: RetrievalStatus
    reason: str = ""
    candidates: tuple[Candidate, ...] = ()
    latency_ms: float = 0.0
    demoted_ids: tuple[int, ...] = field(default=())  # returned candidates that were demoted

    @property
    def ok(self) -> bool:
        """True when the status is OK."""
        return self.status == RetrievalStatus.OK


class Retriever:
    """Top-K drafts for one observation embedding within a deadline."""

    def __init__(self, store: VectorStore, config: RetrieverConfig | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.store = store
        self.config = config or RetrieverConfig()
        self.memory = DemotionMemory(self.config.demote_steps)
        self._clock = clock
        self._step = 0  # control-step counter when the caller passes none

    def reset_episode(self) -> None:
        """Forget rejections and restart the step counter (call at each episode start)."""
        self.memory.reset()
        self._step = 0

    def reject(self, candidates: Iterable[Candidate | int], step: int | None = None) -> None:
        """Demote candidates the verifier rejected (default: at the last retrieval's step)."""
        when = self._step - 1 if step is None else step
        for cand in candidates:
            self.memory.reject(cand, when)

    def retrieve(self, task: str, embedding: np.ndarray, *, k: int | None = None,
                 deadline_s: float | None = None, step: int | None = None,
                 demoted_ids: Iterable[int] = ()) -> RetrievalResult:
        """Top-``k`` candidates; never raises for a request or backend problem.

        Args:
            task: task (collection) to search.
            embedding: (dimension,) query embedding.
            k: candidates wanted (default: the config's k).
            deadline_s: time budget from this call in seconds; None or 0 = no deadline (as
                in Retrieve.srv). In-process search cannot be interrupted: a late search
                still returns what it found, with status DEADLINE_EXCEEDED.
            step: control-step index for demotion; None counts calls.
            demoted_ids: extra ids to rank last (from the request), on top of the memory.
        """
        t0 = self._clock()
        now = self._step if step is None else step
        self._step = now + 1
        k = self.config.k if k is None else k

        def done(status: RetrievalStatus, reason: str = "", cands=(), demoted=()):
            return RetrievalResult(status, reason, tuple(cands),
                                   (self._clock() - t0) * 1e3, tuple(demoted))

        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= 256:
            return done(RetrievalStatus.BAD_REQUEST, f"k: expected 1..256, got {k!r}")
        if deadline_s is not None and not (math.isfinite(deadline_s) and deadline_s >= 0):
            return done(RetrievalStatus.BAD_REQUEST,
                        f"deadline_s: expected >= 0 s, got {deadline_s}")
        budget_s = deadline_s or None
        ids = self.memory.active_ids(now) | {int(i) for i in demoted_ids}
        bins = self.memory.active_bins(now) if self.config.demote_same_bins else set()
        # Over-fetch so that demoted hits can sink below k others (bins demotion: best effort).
        limit = k + len(ids) + len(bins)
        try:
            hits = self.store.search(task, embedding, limit, deadline_s=budget_s)
        except StoreError as exc:
            late = budget_s is not None and self._clock() - t0 > budget_s
            status = RetrievalStatus.DEADLINE_EXCEEDED if late else exc.status
            return done(status, str(exc))
        if not hits:
            return done(RetrievalStatus.EMPTY, f"the collection for task {task!r} holds no "
                                               f"points")
        try:
            ranked = hits_to_candidates(hits)
        except ValueError as exc:
            return done(RetrievalStatus.ERROR, f"malformed candidate (corrupt payload or "
                                               f"score) in task {task!r}: {exc}")
        ranked, demoted = self._demote(ranked, ids, bins)
        chosen = ranked[:k]
        demoted_out = [c.id for c in chosen if c.id in demoted]
        elapsed_s = self._clock() - t0
        if budget_s is not None and elapsed_s > budget_s:
            return done(RetrievalStatus.DEADLINE_EXCEEDED,
                        f"retrieval took {elapsed_s * 1e3:.2f} ms, budget {budget_s * 1e3:.2f} "
                        f"ms; returning the {len(chosen)} candidates found", chosen, demoted_out)
        return done(RetrievalStatus.OK, "", chosen, demoted_out)

    def _demote(self, ranked: list[Candidate], ids: set[int],
                bins: set[bytes]) -> tuple[list[Candidate], set[int]]:
        demoted = {c.id for c in ranked if c.id in ids or c.bins.tobytes() in bins}
        if not demoted:
            return ranked, demoted
        if self.config.demotion == "rank_last":
            order = sorted(range(len(ranked)), key=lambda i: (ranked[i].id in demoted, i))
        else:  # "penalty": rank by the lowered score, stable among equals
            penalty = self.config.demote_penalty
            order = sorted(range(len(ranked)), key=lambda i: (
                -(ranked[i].score - (penalty if ranked[i].id in demoted else 0.0)), i))
        return [ranked[i] for i in order], demoted


def hits_to_candidates(hits: Iterable[Hit]) -> list[Candidate]:
    """Parse raw store hits (e.g. in an offline tool).

    Raises ValueError on a corrupt payload or a score that is no cosine similarity (NaN, inf,
    beyond [-1, 1]).
    """
    return [Candidate(id=h.id, score=h.score, record=StepRecord.from_payload(h.payload))
            for h in hits]
