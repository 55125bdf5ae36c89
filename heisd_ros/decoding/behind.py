"""Checks behind: the target VLA verifies an unverified action while the arm executes it.

``heisd_behind`` executes a retrieved action without the target (as ``heisd`` does) and, at
once, hands the same observation (its encoded prefix) and the same candidate to the target on
a background thread: one forward over the candidate's 7 tokens as a chain, judged by the same
gripper-safe sequence-wise rule a verified step applies to a retrieval draft. The check
confirms the action when the rule accepts all 7 tokens, else rejects it; either way it
records the teacher-forced bin difference (the target's greedy bin at each position, given
the candidate's earlier tokens, against the candidate's bin).

The next step collects the verdict before it may run unverified itself (waiting for it if the
check is still running): a rejection forces that step verified and ends the run, so every
executed action is checked by the target before it runs or within one step after.

``heisd_deadline`` checks an action whose first tokens the target verified before it ran: the
check continues that step's own decode state (its cache holds the prompt and the verified
tokens) with one forward over the remaining tokens, the round the verified step left out
(:meth:`BehindChecker.start_from`).

On a CUDA device the check runs on its own stream; it shares the GPU with the next step's
vision and retrieval (docs/GPU_RUNBOOK.md). Pure torch + numpy; no rclpy.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from heisd_ros.data.observation import ACTION_DIM
from heisd_ros.decoding.acceptance import AcceptanceRule, VerifyView, first_rejected_dim
from heisd_ros.decoding.interface import BEHIND_CONFIRMED, BEHIND_REJECTED
from heisd_ros.models.draft_tree import DraftTree


@dataclass(frozen=True)
class CheckVerdict:
    """What the target said about one action that ran unverified.

    Attributes:
        step_index: the episode step whose action was checked (-1: unknown).
        rule: the rule that let it run unverified (``follow``, ``similarity``, ``router``,
            ``deadline``).
        confirmed: the sequence-wise rule accepted all the tokens checked (all 7, or with a
            ``deadline`` check those after the verified ones).
        candidate_bins: (7,) the executed bins.
        target_bins: (7,) the target's greedy bin at each position, teacher-forced on the
            executed tokens before it (at verified positions: the executed bin).
        first_rejected_dim: the first position the rule refused, -1 when confirmed.
        check_ms: wall time of the check's forward, ms.
        cpu_ms: CPU time of the thread that ran it, ms.
    """

    step_index: int
    rule: str
    confirmed: bool
    candidate_bins: np.ndarray
    target_bins: np.ndarray
    first_rejected_dim: int
    check_ms: float
    cpu_ms: float

    @property
    def bin_difference(self) -> int:
        """Sum over the 7 dimensions of |target bin - executed bin|."""
        return int(np.abs(self.target_bins - self.candidate_bins).sum())

    @property
    def result(self) -> int:
        """``BEHIND_CONFIRMED`` or ``BEHIND_REJECTED``."""
        return BEHIND_CONFIRMED if self.confirmed else BEHIND_REJECTED


def check_action(target, state, candidate_bins, rule: AcceptanceRule, step_index: int = -1,
                 rule_name: str = "", stream=None, ready=None,
                 first_dim: int = 0) -> CheckVerdict:
    """Verify the executed ``candidate_bins`` in one target forward.

    Args:
        target: the target VLA.
        state: ``target.start(prefix, gripper_closed)`` for the executed step's prefix (a
            fresh decode state; it is consumed), or, with ``first_dim`` > 0, the executed
            step's own decode state after its verified tokens.
        candidate_bins: (7,) the executed action's bins.
        rule: the acceptance rule a verified retrieval draft faces (gripper-safe).
        step_index: the executed step's index in its episode (carried into the verdict).
        rule_name: the rule that let it run unverified (likewise).
        stream: a CUDA stream to run on (None: the current one).
        ready: a CUDA event recorded on the deciding thread's stream after ``state`` was
            made; the check's stream waits for it (None: no wait).
        first_dim: action tokens ``state`` already holds (the target verified them); only
            the rest is checked, and the verdict's target bins take the executed bins there.
    """
    started, cpu_started = time.perf_counter(), time.thread_time()
    bins = np.asarray(candidate_bins, dtype=np.int64).reshape(ACTION_DIM)
    if len(state.action_tokens) != first_dim:
        raise ValueError(f"state: holds {len(state.action_tokens)} action tokens, the check "
                         f"starts at position {first_dim}")
    tree = DraftTree.chain(target.actions.token_of_bin(bins[first_dim:]), source="check")
    if stream is not None:
        import torch

        if ready is not None:   # the prefix and state come from the deciding thread's stream
            stream.wait_event(ready)
        with torch.cuda.stream(stream):
            out = target.forward(state, tree)
            target_bins = target.target_bins(out, first_dim, state.gripper_closed)
        stream.synchronize()
    else:
        out = target.forward(state, tree)
        target_bins = target.target_bins(out, first_dim, state.gripper_closed)
    view = VerifyView(parents=tree.parents, draft_bins=bins[first_dim:],
                      target_bins=target_bins, dims=first_dim + tree.depths())
    path = list(rule(view))
    return CheckVerdict(step_index=int(step_index), rule=rule_name,
                        confirmed=len(path) == ACTION_DIM - first_dim, candidate_bins=bins,
                        target_bins=np.concatenate([bins[:first_dim], np.asarray(
                            target_bins, dtype=np.int64)]),
                        first_rejected_dim=first_rejected_dim(view, path),
                        check_ms=(time.perf_counter() - started) * 1e3,
                        cpu_ms=(time.thread_time() - cpu_started) * 1e3)


class BehindChecker:
    """Runs at most one check at a time on a background thread."""

    def __init__(self, target, rule: AcceptanceRule):
        self.target, self.rule = target, rule
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future | None = None
        self._stream = None
        #: Checks started so far.
        self.started = 0

    @property
    def pending(self) -> bool:
        """A check was started and its verdict not collected yet."""
        return self._pending is not None

    def start(self, prefix, gripper_closed: bool | None, candidate_bins, step_index: int,
              rule_name: str) -> None:
        """Check an action that is being executed unverified (collect the last one first).

        ``target.start`` runs here, on the caller's thread (it may compute and caches the
        prompt head); only the forward runs in the background.
        """
        self._refuse_pending()
        self._submit(self.target.start(prefix, gripper_closed), candidate_bins, step_index,
                     rule_name, 0)

    def start_from(self, state, candidate_bins, step_index: int, rule_name: str) -> None:
        """Check the rest of an action whose first tokens ``state`` verified (collect first).

        ``state`` is the executed step's decode state after its last target forward (it is
        consumed); ``candidate_bins`` are the executed action's 7 bins, its first
        ``len(state.action_tokens)`` the verified ones.
        """
        self._refuse_pending()
        self._submit(state, candidate_bins, step_index, rule_name, len(state.action_tokens))

    def _refuse_pending(self) -> None:
        if self._pending is not None:
            raise RuntimeError("start: collect the pending check first")

    def _submit(self, state, candidate_bins, step_index: int, rule_name: str,
                first_dim: int) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="heisd-check")
            if getattr(self.target.device, "type", "") == "cuda":
                import torch

                self._stream = torch.cuda.Stream(device=self.target.device)
        ready = None
        if self._stream is not None:
            import torch

            ready = torch.cuda.Event()
            ready.record()
        bins = np.array(candidate_bins, dtype=np.int64)
        self._pending = self._pool.submit(check_action, self.target, state, bins, self.rule,
                                          step_index, rule_name, self._stream, ready, first_dim)
        self.started += 1

    def collect(self) -> tuple[CheckVerdict | None, float]:
        """(the pending check's verdict, ms waited for it); (None, 0.0) when none is pending.

        Re-raises what the check raised.
        """
        if self._pending is None:
            return None, 0.0
        future, self._pending = self._pending, None
        started = time.perf_counter()
        verdict = future.result()
        return verdict, (time.perf_counter() - started) * 1e3
