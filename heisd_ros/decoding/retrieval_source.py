"""Retrieval SD: a draft source over a vector-DB client (HeiSD components 1 and 3).

Per action the source queries the DB once with the observation's embedding (the target's
pooled vision features of both cameras, concatenated, L2-normalised) and turns the top-K
candidates into the sequence-wise group tree (``retrieval_tree.build_group_tree``; no
log-probabilities). Later rounds of the same action reuse the candidates for the dimensions
still missing (no new query).

The client is anything with ``retrieve(task, embedding, *, k, deadline_s, demoted_ids)``
returning a :class:`~heisd_ros.retrieval.retriever.RetrievalResult`: the in-process
:class:`~heisd_ros.retrieval.retriever.Retriever`, or the policy node's ROS service client.
The source keeps its own per-episode demotion memory (ids of candidates the target rejected)
and passes it with every request, so demotion works the same through either client.

Failures never propagate: a client that raises, answers late (measured here too, since a
remote client may not enforce the deadline), or answers EMPTY/ERROR/BAD_REQUEST makes
:meth:`RetrievalSource.query` return a failed :class:`RetrievalOutcome` and ``propose``
return None (the caller falls back to the drafter or AR). No torch import here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from heisd_ros.decoding.draft_source import AcceptedDraft, DraftContext, DraftSource
from heisd_ros.decoding.retrieval_accept import GroupAcceptConfig, accepted_group_path
from heisd_ros.decoding.retrieval_tree import GroupTreeConfig, build_group_tree
from heisd_ros.models.draft_tree import DraftTree
from heisd_ros.retrieval.embedding import embedding_from_features
from heisd_ros.retrieval.errors import RetrievalStatus
from heisd_ros.retrieval.records import Candidate, score_problem


class RetrievalClient(Protocol):
    """What the source needs from a retrieval backend (Retriever or a ROS service client)."""

    def retrieve(self, task: str, embedding: np.ndarray, *, k: int | None = None,
                 deadline_s: float | None = None, demoted_ids: Iterable[int] = ()):
        """Top-k candidates for ``embedding`` in ``task``'s collection (a RetrievalResult)."""


@dataclass(frozen=True)
class RetrievalSourceConfig:
    """Retrieval draft settings.

    Attributes:
        k: candidates that draft each action (top-K; K > 1 feeds the group tree's
            combinations).
        fetch_k: candidates requested per query (at least ``k``); those after the first ``k``
            draft nothing: they let ``heisd`` find the next point of the demonstration it
            follows (``heisd_ros.decoding.unverified``).
        deadline_s: time budget of one query in seconds (0 = none); a later answer is dropped.
        demote_steps: actions for which a rejected candidate stays demoted (0 = never).
        tree: shape of the group tree.
        judge: group tolerances used to decide that a candidate was rejected (for demotion
            only; acceptance itself is the decoder's rule).
    """

    k: int = 4
    fetch_k: int = 16
    deadline_s: float = 0.005
    demote_steps: int = 5
    tree: GroupTreeConfig = field(default_factory=GroupTreeConfig)
    judge: GroupAcceptConfig = field(default_factory=GroupAcceptConfig)

    def __post_init__(self) -> None:
        for name in ("k", "fetch_k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 256:
                raise ValueError(f"{name}: expected an int in 1..256, got {value!r}")
        if not (math.isfinite(self.deadline_s) and self.deadline_s >= 0):
            raise ValueError(f"deadline_s: expected a finite value >= 0 s, got {self.deadline_s}")
        if self.demote_steps < 0:
            raise ValueError(f"demote_steps: expected >= 0, got {self.demote_steps}")


@dataclass(frozen=True)
class RetrievalOutcome:
    """One query's result as the decoder sees it.

    Attributes:
        status: RetrievalStatus of the answer (ERROR when the client raised).
        candidates: best first (empty unless ``ok``).
        latency_ms: wall-clock time of the query, measured by the source.
        reason: why it failed, for a person ("" when ok).
    """

    status: RetrievalStatus
    candidates: tuple[Candidate, ...] = ()
    latency_ms: float = 0.0
    reason: str = ""

    @property
    def ok(self) -> bool:
        """True when candidates arrived in time."""
        return self.status == RetrievalStatus.OK and bool(self.candidates)

    @property
    def top_score(self) -> float:
        """Cosine similarity of the best candidate (NaN without candidates)."""
        return float(self.candidates[0].score) if self.candidates else float("nan")


def task_of(observation) -> str:
    """The DB collection key of an observation: its episode's task if set, else the instruction."""
    task = observation.episode.task if observation.episode is not None else None
    return str(task) if task else observation.instruction


class RetrievalSource(DraftSource):
    """Group-tree drafts from top-K retrieved demonstration steps (see the module docstring)."""

    name = "retrieval"

    def __init__(self, client: RetrievalClient, vocab_base: int,
                 config: RetrievalSourceConfig | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.client = client
        self.vocab_base = int(vocab_base)
        self.config = config or RetrievalSourceConfig()
        self._clock = clock
        self._rejected: dict[int, int] = {}   # point id -> action index of its rejection
        self._step = 0                        # actions proposed for in this episode
        self._pending: RetrievalOutcome | None = None
        self._action_id: int | None = None
        self._candidates: tuple[Candidate, ...] = ()
        self._calls = 0
        self.last: RetrievalOutcome | None = None

    # ------------------------------------------------------------------ episode state
    def reset_episode(self) -> None:
        """Forget rejections (call at every episode start)."""
        self._rejected.clear()
        self._step = 0
        self._pending, self._action_id, self._candidates = None, None, ()

    def demoted_ids(self) -> list[int]:
        """Point ids currently demoted (rejected within the last ``demote_steps`` actions)."""
        keep = self.config.demote_steps
        self._rejected = {i: s for i, s in self._rejected.items() if self._step - s <= keep}
        return sorted(self._rejected) if keep else []

    # ------------------------------------------------------------------ querying
    def query(self, task: str, embedding: np.ndarray) -> RetrievalOutcome:
        """Ask the client for top-K candidates; never raises (failures become the status)."""
        cfg = self.config
        self._step += 1  # one query per action: demotion ages in actions
        start = self._clock()

        def outcome(status, candidates=(), reason=""):
            return RetrievalOutcome(status, tuple(candidates), (self._clock() - start) * 1e3,
                                    reason)

        try:
            result = self.client.retrieve(task, embedding, k=max(cfg.k, cfg.fetch_k),
                                          deadline_s=cfg.deadline_s or None,
                                          demoted_ids=self.demoted_ids())
        except Exception as exc:  # noqa: BLE001 - any client failure means "no draft"
            return outcome(RetrievalStatus.ERROR, reason=f"retrieval client raised "
                                                         f"{type(exc).__name__}: {exc}")
        elapsed_s = self._clock() - start
        status = getattr(result, "status", RetrievalStatus.ERROR)
        if status != RetrievalStatus.OK:
            reason = getattr(result, "reason", "") or RetrievalStatus(status).name
            return outcome(RetrievalStatus(status), reason=reason)
        if cfg.deadline_s and elapsed_s > cfg.deadline_s:
            return outcome(RetrievalStatus.DEADLINE_EXCEEDED,
                           reason=f"retrieval took {elapsed_s * 1e3:.2f} ms, budget "
                                  f"{cfg.deadline_s * 1e3:.2f} ms")
        candidates = tuple(result.candidates)
        if not candidates:
            return outcome(RetrievalStatus.EMPTY, reason="no candidates returned")
        # Checked here too, whatever the client: a score decides verify-skip, and a NaN one
        # would pass any ``score < threshold`` test the wrong way.
        for candidate in candidates:
            problem = score_problem(getattr(candidate, "score", None))
            if problem:
                return outcome(RetrievalStatus.ERROR,
                               reason=f"malformed candidate {getattr(candidate, 'id', '?')}: "
                                      f"{problem}")
        return outcome(RetrievalStatus.OK, candidates)

    def prepare(self, outcome: RetrievalOutcome) -> None:
        """Hand a query made by the caller (e.g. for the skip decision) to the next action."""
        self._pending = outcome

    # ------------------------------------------------------------------ DraftSource
    @property
    def retrieval_calls(self) -> int:
        """Queries made inside the last :meth:`propose` (0 when the caller prepared one)."""
        return self._calls

    def propose(self, context: DraftContext) -> DraftTree | None:
        """The group tree of this action's candidates for the dimensions still missing."""
        self._calls = 0
        if context.action_id != self._action_id:
            self._action_id = context.action_id
            outcome = self._pending
            self._pending = None
            if outcome is None:
                embedding = embedding_from_features(context.vision_features)
                outcome = self.query(task_of(context.observation), embedding)
                self._calls = 1
            self.last = outcome
            self._candidates = outcome.candidates[:self.config.k] if outcome.ok else ()
        if not self._candidates or context.max_depth <= 0:
            return None
        start_dim = len(context.action_tokens)
        bins = np.stack([np.asarray(c.bins, dtype=np.int64) for c in self._candidates])
        tree = build_group_tree(bins, self.vocab_base, self.config.tree, start_dim=start_dim)
        return tree.to_draft_tree()

    def feedback(self, accepted: AcceptedDraft) -> None:
        """Demote the candidates whose own draft would not have passed (first round only).

        Along a candidate's own path every node's target bin is conditioned on that
        candidate's earlier tokens, so the judge sees exactly its verdict on the candidate.
        """
        tree = accepted.tree
        if not self._candidates or len(tree) == 0 or self._is_partial(tree):
            return
        draft_bins = self.vocab_base - 1 - tree.tokens
        dims = tree.depths()
        for cand, path in zip(self._candidates, self._own_paths(tree), strict=False):
            if not path:
                continue
            idx = np.asarray(path)
            chain = np.arange(len(idx)) - 1
            ok = accepted_group_path(chain, draft_bins[idx], accepted.target_bins[idx],
                                     dims[idx], self.config.judge)
            if len(ok) < len(idx):
                self._rejected[int(cand.id)] = self._step

    def _is_partial(self, tree: DraftTree) -> bool:
        """True for a later round's tree (not the whole action): no demotion then."""
        return int(tree.depths().max()) + 1 < 7

    def _own_paths(self, tree: DraftTree) -> list[list[int]]:
        """Each candidate's own root-to-leaf chain in ``tree`` (matched by bins)."""
        children: dict[int, dict[int, int]] = {}
        for i, (tok, parent) in enumerate(zip(tree.tokens.tolist(), tree.parents.tolist(),
                                              strict=True)):
            children.setdefault(parent, {}).setdefault(tok, i)
        paths = []
        for cand in self._candidates:
            node, path = -1, []
            for tok in (self.vocab_base - 1 - np.asarray(cand.bins, dtype=np.int64)).tolist():
                node = children.get(node, {}).get(tok, -2)
                if node < 0:
                    path = []
                    break
                path.append(node)
            paths.append(path)
        return paths
