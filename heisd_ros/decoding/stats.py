"""Counters and stage timing returned with every decoded action (mirrors msg/HybridStep.msg)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

#: Stage names of the latency breakdown (HybridStep.msg: <stage>_ms).
STAGES = ("vision", "retrieval", "prefill", "draft", "verify", "overhead", "total")


@dataclass
class StepStats:
    """Work and latency of one 7-token action.

    Attributes:
        target_forwards: VLA LLM forwards (AR: 7; prefill included).
        drafter_forwards: draft-head forwards (catch-up and each tree level count one each).
        retrieval_calls: vector-DB queries.
        accepted_lengths: per verification round of a non-empty draft, tokens committed by that
            round, bonus included (EAGLE convention). Plain AR / prefill forwards are not rounds.
        tokens_from_draft: action tokens taken from drafts (0..7).
        first_error_position: first action position (0..6) where a draft token was rejected;
            -1 when none was.
        draft_source: who drafted ("" for AR, else the sources' names joined by "+").
        stage_ms: latency per stage in ms, keys from ``STAGES``.
        vision_calls: observations encoded for this action (0 or 1).
        forward_tokens: per target forward in order, (context tokens, draft-tree tokens);
            the first is the prefill. What a latency profile prices
            (``heisd_ros.latency``).
        draft_calls: draft proposals (trees built by a draft source).
        check_tokens: (context, tree) tokens of the check behind started on this action;
            None when none.
        collected_verdict: this action waited for the last check behind's verdict before
            it could be decided.
        check_from_cache: the check behind continues this action's own decode state (a
            ``deadline`` check: one forward over the unverified tokens), not a new prompt.
        completed_tokens: action tokens taken unverified at the forward budget
            (``heisd_deadline``), 0 when the target decided or verified them all.
    """

    target_forwards: int = 0
    drafter_forwards: int = 0
    retrieval_calls: int = 0
    accepted_lengths: list[int] = field(default_factory=list)
    tokens_from_draft: int = 0
    first_error_position: int = -1
    draft_source: str = ""
    stage_ms: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    vision_calls: int = 0
    forward_tokens: list[tuple[int, int]] = field(default_factory=list)
    draft_calls: int = 0
    check_tokens: tuple[int, int] | None = None
    collected_verdict: bool = False
    check_from_cache: bool = False
    completed_tokens: int = 0

    @property
    def mean_accepted_length(self) -> float:
        """AL of this action; 1.0 when no draft was verified (every forward gave one token)."""
        if not self.accepted_lengths:
            return 1.0
        return sum(self.accepted_lengths) / len(self.accepted_lengths)


class StageClock:
    """Accumulates milliseconds per stage.

    On the CPU it reads ``perf_counter`` at every stage boundary. On a CUDA device it records a
    pair of CUDA events per stage instead (no synchronisation inside the step) and synchronises
    once in :meth:`finish`, so GPU work is charged to the stage that queued it without a stall
    at every boundary.
    """

    def __init__(self, device=None):
        self._cuda = getattr(device, "type", str(device)) == "cuda"
        self.ms = dict.fromkeys(STAGES, 0.0)
        self._events: list[tuple[str, object, object]] = []
        if self._cuda:
            self._start_event = self._record()
        self._start = time.perf_counter()

    @staticmethod
    def _record():
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    @contextmanager
    def stage(self, name: str):
        """Context manager charging the enclosed time to stage ``name``."""
        if name not in STAGES or name in ("overhead", "total"):
            raise ValueError(f"stage: expected one of {STAGES[:5]}, got {name!r}")
        if self._cuda:
            begin = self._record()
            try:
                yield
            finally:
                self._events.append((name, begin, self._record()))
            return
        start = time.perf_counter()
        try:
            yield
        finally:
            self.ms[name] += (time.perf_counter() - start) * 1e3

    def finish(self) -> dict[str, float]:
        """Close the clock: total since creation, overhead = total - measured stages."""
        if self._cuda:
            import torch

            end = self._record()
            torch.cuda.synchronize()
            for name, begin, stop in self._events:
                self.ms[name] += begin.elapsed_time(stop)
            self.ms["total"] = self._start_event.elapsed_time(end)
        else:
            self.ms["total"] = (time.perf_counter() - self._start) * 1e3
        measured = sum(v for k, v in self.ms.items() if k not in ("overhead", "total"))
        self.ms["overhead"] = max(0.0, self.ms["total"] - measured)
        return dict(self.ms)


class PathCosts:
    """Which of several exact paths to decode with: the one measured cheaper here.

    Drafter-routed steps, and the rounds after a partly accepted retrieval draft, can be
    decoded with the draft head (exact acceptance) or by plain AR; both give the same tokens,
    so the choice is only about time, and it depends on the hardware (on a CPU a draft-head
    round can cost more per token than a target forward; on a GPU it is cheap). Each path's
    cost is an exponential mean of its measured ms (per action, or per token: the caller says
    what it records); each is tried ``warm`` times first, then the cheapest is taken and every
    ``explore_every``-th choice re-measures another (the least recently measured), so a
    change of load or hardware is noticed.
    """

    PATHS = ("drafter", "ar")

    def __init__(self, warm: int = 3, explore_every: int = 25, alpha: float = 0.2,
                 paths: tuple[str, ...] = PATHS):
        if warm < 1 or explore_every < 2 or not 0.0 < alpha <= 1.0 or len(set(paths)) < 2:
            raise ValueError(f"PathCosts: expected warm >= 1, explore_every >= 2, alpha in "
                             f"(0, 1], two or more distinct paths, got {warm}, {explore_every}, "
                             f"{alpha}, {paths}")
        self.warm, self.explore_every, self.alpha = warm, explore_every, alpha
        self.paths = tuple(paths)
        self.mean_ms = dict.fromkeys(self.paths, float("nan"))
        self.samples = dict.fromkeys(self.paths, 0)
        self._last_choice = dict.fromkeys(self.paths, 0)
        self._choices = 0

    def choose(self) -> str:
        """The path of the next step."""
        self._choices += 1
        fewest = min(self.paths, key=lambda p: self.samples[p])
        if self.samples[fewest] < self.warm:
            path = fewest
        else:
            path = min(self.paths, key=lambda p: self.mean_ms[p])
            if self._choices % self.explore_every == 0:
                path = min((p for p in self.paths if p != path),
                           key=lambda p: self._last_choice[p])
        self._last_choice[path] = self._choices
        return path

    def record(self, path: str, ms: float) -> None:
        """A measured step of ``path`` (ms of its target and draft work; NaN is ignored)."""
        if not ms == ms:  # NaN
            return
        old = self.mean_ms[path]
        self.mean_ms[path] = ms if self.samples[path] == 0 else old + self.alpha * (ms - old)
        self.samples[path] += 1

    def describe(self) -> str:
        """e.g. ``drafter 31.2 ms, ar 24.8 ms``."""
        return ", ".join(f"{p} {self.mean_ms[p]:.1f} ms" for p in self.paths)
