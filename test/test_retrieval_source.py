"""Retrieval draft source: group tree from top-K, demotion of rejected drafts, failure statuses."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from heisd_ros.data.observation import EpisodeState, Observation
from heisd_ros.decoding.decoder import ActionDecoder
from heisd_ros.decoding.draft_source import AcceptedDraft, DraftContext
from heisd_ros.decoding.retrieval_source import RetrievalSource, RetrievalSourceConfig
from heisd_ros.retrieval.errors import RetrievalStatus
from heisd_ros.retrieval.records import records_from_episode
from heisd_ros.retrieval.retriever import Retriever, RetrieverConfig
from heisd_ros.retrieval.store import open_store
from heisd_ros.retrieval.store_config import StoreConfig
from test.test_hybrid_helpers import ScriptedClient, candidate, ok, raising

VOCAB = 32000
DIM = 8


OBS = Observation(image_primary=np.zeros((8, 8, 3), np.uint8), image_wrist=None,
                  instruction="stack", episode=EpisodeState("t"))


def context(action_id: int, committed=(), depth=7):
    return DraftContext(observation=OBS, vision_features=np.ones((2, DIM // 2), np.float32),
                        action_tokens=tuple(committed), max_depth=depth,
                        committed_length=10 + len(committed), hidden=None, next_embeds=None,
                        first_call=True, action_id=action_id)


def test_tree_from_top_k_and_later_rounds():
    # the third candidate is fetched (fetch_k) but only the first k = 2 draft
    bins = [[10, 20, 30, 40, 50, 60, 0], [11, 20, 30, 40, 50, 60, 0], [12, 20, 30, 40, 50, 60, 0]]
    client = ScriptedClient(lambda e: ok([candidate(b, 0.9, i) for i, b in enumerate(bins)]))
    source = RetrievalSource(client, VOCAB, RetrievalSourceConfig(k=2, fetch_k=3))
    source.prepare(source.query("t", np.ones(DIM, np.float32)))
    tree = source.propose(context(1))
    assert tree.log_probs is None and tree.source == "retrieval"
    assert sorted(VOCAB - 1 - tree.tokens[tree.parents == -1]) == [10, 11]
    assert client.requests[0]["k"] == 3 and source.retrieval_calls == 0
    later = source.propose(context(1, committed=[1, 2, 3], depth=4))   # no new query
    assert len(client.requests) == 1 and later.depths().max() == 3
    assert sorted(VOCAB - 1 - later.tokens[later.parents == -1]) == [40]


def test_rejected_candidate_is_demoted_in_the_next_request():
    good, bad = [10] * 6 + [0], [200] * 6 + [255]
    client = ScriptedClient(lambda e: ok([candidate(bad, 0.95, 7), candidate(good, 0.9, 8)]))
    source = RetrievalSource(client, VOCAB, RetrievalSourceConfig(k=2, demote_steps=2))
    tree = source.propose(context(1))
    # The target agrees with `good` everywhere: `bad` fails its first group.
    target_bins = np.full(len(tree), 10)
    target_bins[tree.depths() == 6] = 0
    source.feedback(AcceptedDraft(tree, (), target_bins, None))
    source.propose(context(2))
    assert client.requests[-1]["demoted_ids"] == [7]
    for action in range(3, 6):   # expires after demote_steps actions
        source.propose(context(action))
    assert client.requests[-1]["demoted_ids"] == []
    source.reset_episode()
    assert source.demoted_ids() == []


@pytest.mark.parametrize("make, status", [
    (raising, RetrievalStatus.ERROR),
    (lambda e: ok([]), RetrievalStatus.EMPTY),
    (lambda e: object(), RetrievalStatus.ERROR)])
def test_failures_give_no_draft(make, status):
    source = RetrievalSource(ScriptedClient(make), VOCAB)
    assert source.propose(context(1)) is None and source.retrieval_calls == 1
    assert source.last.status == status and source.last.reason


def test_late_answer_is_dropped():
    ticks = iter([0.0, 0.010, 0.020])
    source = RetrievalSource(ScriptedClient(lambda e: ok([candidate([1] * 7)])), VOCAB,
                             RetrievalSourceConfig(deadline_s=0.005), clock=lambda: next(ticks))
    out = source.query("t", np.ones(DIM, np.float32))
    assert out.status == RetrievalStatus.DEADLINE_EXCEEDED and not out.ok


def test_with_a_real_store_a_perfect_draft_costs_one_forward(tmp_path, tiny_random_vla):
    from heisd_ros.retrieval.embedding import embed_observation
    from test.fixtures_decoding import scenes

    vla, obs_list = tiny_random_vla, scenes(3, seed=21)
    ar = [ActionDecoder(vla).decode(o) for o in obs_list]
    vecs = np.stack([embed_observation(vla, o) for o in obs_list])
    recs = records_from_episode("t", 0, np.stack([r.bins for r in ar]),
                                np.stack([r.action for r in ar]), np.zeros((3, 3)))
    store = open_store(StoreConfig(path=str(tmp_path / "db"), exact_search=True), create=True,
                       dimension=vecs.shape[1], model_fingerprint="fp")
    store.create_collection("t")
    store.upsert("t", range(3), vecs, [r.to_payload() for r in recs])
    store.finalize()
    try:
        source = RetrievalSource(Retriever(store, RetrieverConfig(k=2, demote_steps=0)),
                                 vla.actions.vocab_base, RetrievalSourceConfig(deadline_s=0))
        decoder = ActionDecoder(vla, source, draft_in_prefill=True)
        for obs, want in zip(obs_list, ar, strict=True):
            got = decoder.decode(replace(obs, episode=EpisodeState("t")))
            np.testing.assert_array_equal(got.tokens, want.tokens)
            assert got.stats.target_forwards == 1 and got.stats.retrieval_calls == 1
    finally:
        store.close()
