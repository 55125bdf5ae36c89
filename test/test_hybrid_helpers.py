"""Helpers of the hybrid / retrieval-source tests (no tests here): scripted clients, routers."""

from __future__ import annotations

import numpy as np

from heisd_ros.decoding.decoder import ActionDecoder
from heisd_ros.kinematics.router import KinematicRouter, RouterConfig, RouterStats
from heisd_ros.retrieval.errors import RetrievalStatus
from heisd_ros.retrieval.records import Candidate, StepRecord
from heisd_ros.retrieval.retriever import RetrievalResult
from test.polling import ManualClock

STRAIGHT_FAST = np.stack([np.array([0.3, 0.0, 0.2]) + t * np.array([0.02, 0.0, 0.0])
                          for t in range(5)])      # F = 1 with the stats below
STANDING = np.tile([0.3, 0.0, 0.2], (5, 1))         # F = 0


def router(threshold: float) -> KinematicRouter:
    """Window of 3 positions; D normalised over 0..0.1 m."""
    stats = RouterStats(0.0, 1.0, 0.0, 0.1, window=3)
    return KinematicRouter(RouterConfig(window=3, threshold=threshold), stats)


def candidate(bins, score: float = 0.99, cid: int = 0, task: str = "t") -> Candidate:
    bins = np.asarray(bins, dtype=np.int64)
    rec = StepRecord(task=task, episode=0, step=cid, bins=bins, action=np.zeros(7),
                     lookahead_bins=np.zeros((0, 7)), lookahead_actions=np.zeros((0, 7)),
                     ee_position_m=np.zeros(3))
    return Candidate(id=cid, score=score, record=rec)


class ScriptedClient:
    """Answers every request with ``make(embedding)``; records the requests.

    ``delay``: (clock, seconds): each answer moves ``clock`` (a ``ManualClock`` the retrieval
    source reads) on by ``seconds``, an answer that slow without waiting for it.
    """

    def __init__(self, make, delay: tuple[ManualClock, float] | None = None):
        self.make, self.delay, self.requests = make, delay, []

    def retrieve(self, task, embedding, *, k=None, deadline_s=None, demoted_ids=()):
        self.requests.append({"task": task, "k": k, "deadline_s": deadline_s,
                              "demoted_ids": list(demoted_ids), "dim": len(embedding)})
        if self.delay is not None:
            clock, seconds = self.delay
            clock.advance(seconds)
        return self.make(embedding)


def ok(cands) -> RetrievalResult:
    return RetrievalResult(RetrievalStatus.OK, "", tuple(cands))


def raising(_embedding):
    raise ConnectionError("service unavailable")


def ar_bins(vla, obs) -> np.ndarray:
    return ActionDecoder(vla).decode(obs).bins


def route_all_calibration(path, skip_threshold: float, precision_target: float = 0.95,
                          notes: str = ""):
    """Save a calibration with router threshold 0 (every full-window step goes to retrieval).

    ``skip_threshold``: 1.0 never skips verification by similarity, 0.0 always may.
    Returns ``path``.
    """
    from heisd_ros.calibration.verify_skip import VerifySkipCalibration

    return VerifySkipCalibration(
        skip_threshold=skip_threshold, router_threshold=0.0, precision_target=precision_target,
        skip_precision=float("nan"), skip_support=0, skip_rate=0.0,
        hidden_similarity_threshold=1.0, n_held_out_steps=0, n_pairs=0, notes=notes).save(path)
