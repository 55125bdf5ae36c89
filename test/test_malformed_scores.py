"""A retrieval score that is no cosine similarity never lets an action skip verification.

A NaN or +inf score used to pass ``score < threshold`` the wrong way, so a garbage candidate
ran without the VLA at every step. Each route a score can take is covered: a client handing
the decoder anything (the source checks), the embedded store's hits (the retriever checks) and
the retrieval node's messages (the service client checks).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from heisd_ros.msg import RetrievalCandidate

from heisd_ros.decoding.decoder import ActionDecoder
from heisd_ros.decoding.hybrid import HybridConfig, HybridDecoder
from heisd_ros.decoding.retrieval_source import RetrievalSource, RetrievalSourceConfig
from heisd_ros.nodes.retrieval_client import candidate_from_msg
from heisd_ros.retrieval.errors import RetrievalStatus
from heisd_ros.retrieval.records import SCORE_TOLERANCE, Candidate, score_problem
from heisd_ros.retrieval.retriever import Retriever
from heisd_ros.retrieval.store import Hit
from test.fixtures_decoding import scenes
from test.test_hybrid_helpers import STRAIGHT_FAST, ScriptedClient, ar_bins, candidate, ok, router

BAD_SCORES = [math.nan, math.inf, -math.inf, 1.5, -1.0 - 2 * SCORE_TOLERANCE]
RS = RetrievalSourceConfig(deadline_s=0.5)


class _RawCandidate:
    """What a broken backend may hand over: a candidate object whose score was never checked."""

    def __init__(self, good: Candidate, score: float) -> None:
        self.id, self.score, self.record = good.id, score, good.record

    @property
    def bins(self):
        return self.record.bins

    @property
    def action(self):
        return self.record.action


@pytest.mark.parametrize("score", BAD_SCORES)
@pytest.mark.parametrize("method", ["router_skip", "heisd"])
def test_a_bad_score_is_refused_and_never_skipped(tiny_trained_vla, method, score):
    vla = tiny_trained_vla
    observations = scenes(3, seed=21)
    # The candidate is the AR action itself, so a skip would even look right: only the
    # score is wrong, and that alone must refuse it.
    answers = {}

    def make(_embedding):
        return ok([_RawCandidate(candidate(answers["bins"], 0.99, 1), score)])

    hybrid = HybridDecoder(vla, HybridConfig(method=method, skip_threshold=0.9, retrieval=RS),
                           retrieval=RetrievalSource(ScriptedClient(make),
                                                     vla.actions.vocab_base, RS),
                           router=router(0.0))
    ar = ActionDecoder(vla)
    for obs in observations:
        answers["bins"] = ar_bins(vla, obs)
        got = hybrid.decode(obs, ee_positions_m=STRAIGHT_FAST)
        assert not got.record.verify_skipped
        assert "malformed candidate" in got.record.status, got.record.status
        assert got.stats.target_forwards == 7  # no drafter: the refused step is plain AR
        np.testing.assert_array_equal(got.tokens, ar.decode(obs).tokens)


@pytest.mark.parametrize("score", BAD_SCORES)
def test_the_embedded_retriever_refuses_a_bad_score(score):
    class Store:  # a backend whose hits carry a broken score
        def search(self, task, embedding, limit, deadline_s=None):
            good = candidate([1] * 7, 0.9, 3).record
            return [Hit(id=3, score=score, payload=good.to_payload())]

    result = Retriever(Store()).retrieve("t", np.ones(8, np.float32) / math.sqrt(8))
    assert result.status == RetrievalStatus.ERROR
    assert "malformed candidate" in result.reason and "score" in result.reason
    assert not result.candidates


@pytest.mark.parametrize("score", BAD_SCORES)
def test_the_service_client_refuses_a_bad_score(score):
    msg = RetrievalCandidate(id=5, score=score, task="t", bins=[1] * 7, action=[0.0] * 7)
    with pytest.raises(ValueError, match="score"):
        candidate_from_msg(msg)


@pytest.mark.parametrize("score", [-1.0, 0.0, 0.5, 1.0, 1.0 + SCORE_TOLERANCE / 2])
def test_real_similarities_are_accepted(score):
    assert score_problem(score) == ""
    assert candidate([1] * 7, score).score == score
