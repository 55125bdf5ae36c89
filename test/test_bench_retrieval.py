"""heisd-bench retrieval: table and JSON on synthetic vectors and on a DB of our own demos."""

from __future__ import annotations

import json

import numpy as np
import pytest

from heisd_ros.retrieval.embedding import ID_STRIDE
from heisd_ros.retrieval.store import open_store
from heisd_ros.retrieval.store_config import StoreConfig
from heisd_ros.tools import bench, retrieval_vectors


def test_synthetic_rows_have_latency_cpu_time_and_recall(tmp_path, capsys):
    out = tmp_path / "r.json"
    code = bench.main(["retrieval", "--sizes", "400", "--dims", "32", "--queries", "30",
                       "--ef", "32", "--k", "4", "--qdrant-max", "0", "--datatypes",
                       "float32,float16", "--workdir", str(tmp_path), "--json", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    assert result["source"]["kind"] == "synthetic"
    assert [r["backend"] for r in result["rows"]] == ["edge-hnsw", "edge-float16"]
    for row in result["rows"]:
        assert row["n"] == 400 and row["queries"] == 30
        assert row["recall_at_4"] >= 0.9
        assert 0 < row["latency_ms"]["median"] <= row["latency_ms"]["p99"]
        assert row["cpu_ms"]["median"] > 0
    assert "cpu p99" in capsys.readouterr().out
    assert not list(tmp_path.glob("heisd_bench_*"))   # temporary DBs removed


def test_quantization_options_are_recorded_per_row(tmp_path, capsys):
    out = tmp_path / "r.json"
    code = bench.main(["retrieval", "--sizes", "400", "--dims", "32", "--queries", "20",
                       "--ef", "32", "--k", "4", "--qdrant-max", "400", "--datatypes",
                       "float32,float16", "--quantization", "int8", "--oversampling", "3",
                       "--m", "8", "--workdir", str(tmp_path), "--json", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    assert (result["quantization"], result["oversampling"], result["rescore"]) == ("int8", 3.0,
                                                                                   True)
    rows = {r["backend"]: r for r in result["rows"]}
    assert list(rows) == ["edge-hnsw-int8", "edge-float16-int8", "qdrant-local"]
    for name, datatype in (("edge-hnsw-int8", "float32"), ("edge-float16-int8", "float16")):
        row = rows[name]
        assert (row["vector_datatype"], row["hnsw_m"], row["hnsw_ef"]) == (datatype, 8, 32)
        assert (row["quantization"], row["oversampling"], row["rescore"]) == ("int8", 3.0, True)
        assert row["recall_at_4"] >= 0.9
    # qdrant-client's local mode ignores quantization, so its row says so.
    assert rows["qdrant-local"]["quantization"] == "none"
    assert rows["qdrant-local"]["oversampling"] is None
    table = capsys.readouterr().out
    assert "quant" in table and "int8x3" in table


def test_oversampling_below_one_is_refused(capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["retrieval", "--quantization", "int8", "--oversampling", "0.5"])
    assert "--oversampling" in capsys.readouterr().err


def _db(tmp_path, dim=24, shared=0.0):
    """A DB of 15 demonstrations of 6 steps (10 of task a, 5 of b).

    ``shared``: a component every vector has (one robot's frames all point one way).
    """
    rng = np.random.default_rng(0)
    db = tmp_path / "db"
    common = rng.normal(size=dim)
    with open_store(StoreConfig(path=str(db)), create=True, dimension=dim,
                    model_fingerprint="fp") as store:
        for task, episodes in (("a", range(0, 10)), ("b", range(10, 15))):
            store.create_collection(task)
            for e in episodes:
                vecs = (rng.normal(size=(6, dim)) + shared * common).astype(np.float32)
                store.upsert(task, [e * ID_STRIDE + t for t in range(6)], vecs,
                             [{"step": t} for t in range(6)])
        store.finalize()
    return db


def test_db_source_holds_out_whole_demonstrations(tmp_path):
    db, dim = _db(tmp_path), 24
    source = retrieval_vectors.read_db(str(db), query_every=5)
    # Held out: episodes 4, 9 of task a and 14 of task b (every 5th of each task).
    assert source["tasks"] == ["a", "b"] and source["queries"].shape == (18, dim)
    assert source["vectors"].shape == (12 * 6, dim)
    np.testing.assert_allclose(np.linalg.norm(source["vectors"], axis=1), 1.0, atol=1e-5)
    out = tmp_path / "r.json"
    assert bench.main(["retrieval", "--from-db", str(db), "--sizes", "50,200", "--queries",
                       "10", "--ef", "16", "--k", "4", "--qdrant-max", "0", "--query-every",
                       "5", "--workdir", str(tmp_path), "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["source"]["kind"] == "db" and result["source"]["source_points"] == 72
    assert [r["n"] for r in result["rows"]] == [50, 200]  # 200: grown between steps
    assert all(r["dim"] == dim and r["queries"] == 10 for r in result["rows"])


def test_grown_points_lie_between_consecutive_steps_of_a_demonstration():
    vectors = np.eye(4, dtype=np.float32)
    ids = np.array([0, 1, 2, ID_STRIDE])  # steps 0-2 of one demo, step 0 of the next
    grown = retrieval_vectors.grow(vectors, ids, 40, seed=0)
    extra = grown[4:]
    assert len(grown) == 40 and np.allclose(np.linalg.norm(extra, axis=1), 1.0, atol=1e-6)
    assert not extra[:, 3].any()  # never towards the other demonstration
    # each new point mixes steps (0, 1) or (1, 2) only
    assert all(np.count_nonzero(row) <= 2 and (row[0] == 0 or row[2] == 0) for row in extra)


def test_lifting_keeps_every_inner_product_and_concentration_reaches_its_target():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(300, 16)).astype(np.float32) + 1.0
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    lifted = retrieval_vectors.lift(x, 128, seed=3)
    np.testing.assert_allclose(lifted @ lifted.T, x @ x.T, atol=1e-5)
    dense, queries, _ = retrieval_vectors.concentrate(x, x[:5], 0.9)
    assert retrieval_vectors.mean_cosine(dense) == pytest.approx(0.9, abs=1e-3)
    # the offsets from the mean direction keep their order: nearest neighbours stay
    for i in range(5):
        assert np.argsort(-(x @ x[i]))[1] == np.argsort(-(dense @ queries[i]))[1]
    with pytest.raises(ValueError, match="lifting"):
        retrieval_vectors.lift(x, 8, seed=0)


def test_centering_is_compared_side_by_side_on_concentrated_vectors(tmp_path):
    db = _db(tmp_path, shared=3.0)
    out = tmp_path / "r.json"
    assert bench.main(["retrieval", "--from-db", str(db), "--sizes", "300", "--dims", "64",
                       "--concentration", "0.95", "--queries", "10", "--ef", "16", "--k", "4",
                       "--quantization", "int8", "--centering", "off,on", "--qdrant-max", "0",
                       "--query-every", "5", "--workdir", str(tmp_path), "--json",
                       str(out)]) == 0
    result = json.loads(out.read_text())
    assert [r["backend"] for r in result["rows"]] == ["edge-hnsw-int8",
                                                      "edge-hnsw-int8-centered"]
    assert [r["centering"] for r in result["rows"]] == [False, True]
    assert result["source"]["dim"] == 64 and result["source"]["concentration"] == 0.95
    assert 0.85 < result["source"]["pairwise_cosine_p1_p50_p99"][1] < 1.0
    with pytest.raises(SystemExit):
        bench.parse_args(["retrieval", "--centering", "maybe"])
