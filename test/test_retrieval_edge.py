"""Edge backend specifics: float16 storage, payloads from the cache or the shard, export."""

from __future__ import annotations

import numpy as np
import pytest

from heisd_ros.retrieval.store import open_store
from heisd_ros.retrieval.store_config import StoreConfig

DIM = 32
FP = "test-embedder:v1"


def _unit(n: int, seed: int = 0) -> np.ndarray:
    vecs = np.random.default_rng(seed).normal(size=(n, DIM)).astype(np.float32)
    return vecs / np.linalg.norm(vecs, axis=1, keepdims=True)


def _build(path, vecs, **kw):
    with open_store(StoreConfig(path=str(path), **kw), create=True, dimension=DIM,
                    model_fingerprint=FP) as store:
        store.create_collection("t")
        store.upsert("t", range(10, 10 + len(vecs)), vecs,
                     [{"step": i, "bins": [i % 256] * 7} for i in range(len(vecs))])
        store.finalize()


@pytest.mark.parametrize(("exact", "cache"), [(True, True), (False, True), (False, False)])
def test_hits_carry_their_own_payloads_in_rank_order(tmp_path, exact, cache):
    vecs = _unit(300)
    _build(tmp_path / "db", vecs, full_scan_threshold_kb=1)
    config = StoreConfig(path=str(tmp_path / "db"), exact_search=exact, payload_cache=cache)
    with open_store(config) as store:
        for q in (3, 150, 299):
            hits = store.search("t", vecs[q], k=8)
            order = np.argsort(-(vecs @ vecs[q]))[:8]
            assert [h.id for h in hits] == [10 + int(i) for i in order]
            assert [h.payload["step"] for h in hits] == [h.id - 10 for h in hits]
            assert all(h.payload["task"] == "t" for h in hits)


def test_float16_db_opens_with_the_default_config(tmp_path):
    vecs = _unit(200, seed=1)
    _build(tmp_path / "db16", vecs, vector_datatype="float16", exact_search=True)
    _build(tmp_path / "db32", vecs, exact_search=True)
    with open_store(StoreConfig(path=str(tmp_path / "db16"), exact_search=True)) as store:
        hits = store.search("t", vecs[7], k=3)
        assert hits[0].id == 17 and hits[0].score == pytest.approx(1.0, abs=2e-3)
        ids, exported = store.export("t")
    assert ids.tolist() == list(range(10, 210))
    np.testing.assert_allclose(exported, vecs, atol=2e-3)   # float16 precision
    with open_store(StoreConfig(path=str(tmp_path / "db32"))) as store:
        ids, exported = store.export("t")
    np.testing.assert_allclose(exported, vecs, atol=1e-6)


def test_unknown_datatype_is_refused():
    with pytest.raises(ValueError, match="vector_datatype"):
        StoreConfig(path="x", vector_datatype="int4")


def test_payload_cache_pages_through_big_shards_and_follows_upserts(tmp_path):
    vecs = _unit(2500, seed=2)   # more than one scroll page (1024)
    _build(tmp_path / "db", vecs, exact_search=True)
    with open_store(StoreConfig(path=str(tmp_path / "db"), exact_search=True)) as store:
        store.warm_up()
        assert len(store._payloads[store._name("t")]) == 2500
        assert store.search("t", vecs[2222], k=1)[0].payload["step"] == 2222
        store.upsert("t", [10 + 2222], vecs[2222:2223], [{"step": -5}])
        assert store.search("t", vecs[2222], k=1)[0].payload == {"step": -5, "task": "t"}
        ids, exported = store.export("t")
    assert len(ids) == 2500 and np.array_equal(ids, np.arange(10, 2510))
