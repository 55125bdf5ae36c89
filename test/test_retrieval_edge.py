"""Edge backend specifics: float16 storage, int8 quantization, payloads, export."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from heisd_ros.retrieval.edge_store import SHARD_CONFIG_FILE, _stored_index
from heisd_ros.retrieval.store import open_store
from heisd_ros.retrieval.store_config import StoreConfig
from heisd_ros.tools.bench import _exact_top_k, demo_shaped_vectors

DIM = 32
FP = "test-embedder:v1"


def _unit(n: int, seed: int = 0) -> np.ndarray:
    vecs = np.random.default_rng(seed).normal(size=(n, DIM)).astype(np.float32)
    return vecs / np.linalg.norm(vecs, axis=1, keepdims=True)


def _build(path, vecs, **kw):
    with open_store(StoreConfig(path=str(path), **kw), create=True, dimension=vecs.shape[1],
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


def _demo_shaped(n: int, dim: int, queries: int):
    """(n, dim) demonstration-shaped rows and queries from new demonstrations of the tasks."""
    vecs = demo_shaped_vectors(n, dim, seed=0)
    return vecs, demo_shaped_vectors(queries * 13, dim, seed=0, episode_seed=1)[::13]


def _score_error(hits, vecs, query) -> float:
    """Largest |returned score - float32 cosine| of the hits (ids are offset by 10)."""
    exact = vecs @ (query / np.linalg.norm(query))
    return max(abs(h.score - float(exact[h.id - 10])) for h in hits)


def test_int8_search_with_rescoring_keeps_recall_and_exact_scores(tmp_path):
    vecs, queries = _demo_shaped(2000, 128, queries=30)
    truth = _exact_top_k(vecs, queries, 8) + 10
    # 2000 x 128 x 4 B = 1 MB per shard: above the 64 KB threshold, so optimize() builds the
    # HNSW graph and the int8 copies.
    _build(tmp_path / "db", vecs, quantization="int8", full_scan_threshold_kb=64)
    # The serving config does not repeat the quantization: the shard keeps its own.
    with open_store(StoreConfig(path=str(tmp_path / "db"))) as store:
        assert store.stored_quantization("t") == "int8"
        recall, errors = [], []
        for query, want in zip(queries, truth, strict=True):
            hits = store.search("t", query, k=8)
            recall.append(len({h.id for h in hits} & set(want.tolist())) / 8)
            errors.append(_score_error(hits, vecs, query))
    assert np.mean(recall) >= 0.95
    assert max(errors) < 1e-5   # rescored with the stored float32 vectors
    # Without rescoring the scores are the int8 approximations: proof that int8 is searched.
    config = StoreConfig(path=str(tmp_path / "db"), quantization_rescore=False,
                         quantization_oversampling=1.0)
    with open_store(config) as store:
        assert max(_score_error(store.search("t", q, k=8), vecs, q) for q in queries) > 1e-4
    # Exact search stays exact on an int8 DB, with or without rescoring asked for.
    for rescore in (True, False):
        config = StoreConfig(path=str(tmp_path / "db"), exact_search=True,
                             quantization_rescore=rescore)
        with open_store(config) as store:
            for query, want in zip(queries[:5], truth[:5], strict=True):
                hits = store.search("t", query, k=8)
                assert [h.id for h in hits] == want.tolist()
                assert _score_error(hits, vecs, query) < 1e-5


def test_quantization_is_kept_across_reopen_and_later_optimisation(tmp_path):
    vecs, queries = _demo_shaped(1600, 64, queries=10)
    db = tmp_path / "db"
    _build(db, vecs[:800], quantization="int8", full_scan_threshold_kb=16)
    # Reopen with a config that says "none" and add points: the next optimize() builds new
    # segments from the stored config, which must still quantize.
    with open_store(StoreConfig(path=str(db), full_scan_threshold_kb=16)) as store:
        store.upsert("t", range(810, 1610), vecs[800:], [{"step": i} for i in range(800)])
        store.finalize()
        # A "none" config creating a new collection in the same DB creates it unquantized.
        store.create_collection("plain")
        assert store.stored_quantization("plain") == "none"
        shard_dir = db / store._name("t")
    stored = json.loads((shard_dir / SHARD_CONFIG_FILE).read_text())
    assert stored["vectors"][""]["quantization_config"]["scalar"]["type"] == "int8"
    config = StoreConfig(path=str(db), quantization_rescore=False,
                         quantization_oversampling=1.0)
    with open_store(config) as store:
        assert store.stored_quantization("t") == "int8"
        assert store.count("t") == 1600
        # Queries near the points added after the reopen get int8 scores too.
        errors = [_score_error(store.search("t", vecs[i], k=4), vecs, vecs[i])
                  for i in range(900, 1600, 70)]
    assert max(errors) > 1e-4
    # An unquantized DB stays unquantized when opened with an int8 config.
    _build(tmp_path / "plain", vecs[:300], exact_search=True)
    with open_store(StoreConfig(path=str(tmp_path / "plain"), quantization="int8")) as store:
        store.search("t", queries[0], k=3)   # loads (and rewrites the config of) the shard
        assert store.stored_quantization("t") == "none"


def test_unsupported_stored_quantization_is_refused(tmp_path):
    (tmp_path / SHARD_CONFIG_FILE).write_text(json.dumps({"vectors": {"": {
        "size": 4, "distance": "Cosine", "quantization_config": {"binary": {}}}}}))
    with pytest.raises(ValueError, match="quantization this code does not support"):
        _stored_index(tmp_path)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"quantization": "int4"}, "quantization: unknown"),
    ({"quantization": "INT8"}, "quantization: unknown"),
    ({"quantization_oversampling": 0.5}, "quantization_oversampling"),
    ({"quantization_oversampling": math.nan}, "quantization_oversampling"),
    ({"quantization_oversampling": math.inf}, "quantization_oversampling"),
    ({"quantization_oversampling": "2"}, "quantization_oversampling"),
    ({"quantization_rescore": "yes"}, "quantization_rescore"),
])
def test_invalid_quantization_settings_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}"):
        StoreConfig(path="x", **kwargs)


def test_two_stores_over_one_db_warm_their_own_tasks_and_close_releases_a_shard(tmp_path):
    """How eval workers share one DB: each loads only its tasks; close() hands a shard on."""
    vecs = _unit(40, seed=3)
    with open_store(StoreConfig(path=str(tmp_path)), create=True, dimension=DIM,
                    model_fingerprint=FP) as store:
        for task in ("a", "b"):
            store.create_collection(task)
            store.upsert(task, range(len(vecs)), vecs, [{"step": i} for i in range(len(vecs))])
        store.finalize()
    first = open_store(StoreConfig(path=str(tmp_path)), model_fingerprint=FP)
    second = open_store(StoreConfig(path=str(tmp_path)), model_fingerprint=FP)
    first.warm_up(["a"])
    second.warm_up(["b"])
    assert first.search("a", vecs[0], 1)[0].id == 0
    assert second.search("b", vecs[5], 1)[0].id == 5
    first.close()
    second.warm_up(["a"])
    assert second.search("a", vecs[7], 1)[0].id == 7
    second.close()
