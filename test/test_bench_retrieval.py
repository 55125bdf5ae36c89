"""heisd-bench retrieval: table and JSON on synthetic vectors and on a DB of our own demos."""

from __future__ import annotations

import json

import numpy as np
import pytest

from heisd_ros.retrieval.embedding import ID_STRIDE
from heisd_ros.retrieval.store import open_store
from heisd_ros.retrieval.store_config import StoreConfig
from heisd_ros.tools import bench


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


def test_db_source_holds_out_whole_demonstrations(tmp_path):
    rng = np.random.default_rng(0)
    db, dim = tmp_path / "db", 24
    with open_store(StoreConfig(path=str(db)), create=True, dimension=dim,
                    model_fingerprint="fp") as store:
        for task, episodes in (("a", range(0, 10)), ("b", range(10, 15))):
            store.create_collection(task)
            for e in episodes:
                vecs = rng.normal(size=(6, dim)).astype(np.float32)
                store.upsert(task, [e * ID_STRIDE + t for t in range(6)], vecs,
                             [{"step": t} for t in range(6)])
        store.finalize()
    vectors, queries, info = bench.db_vectors(str(db), queries=100, query_every=5)
    # Held out: episodes 4, 9 of task a and 14 of task b (every 5th of each task).
    assert info["tasks"] == ["a", "b"] and info["query_points"] == 3 * 6
    assert vectors.shape == (12 * 6, dim) and queries.shape == (18, dim)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    out = tmp_path / "r.json"
    assert bench.main(["retrieval", "--db", str(db), "--sizes", "50,1000", "--queries", "10",
                       "--ef", "16", "--k", "4", "--qdrant-max", "0", "--query-every", "5",
                       "--workdir", str(tmp_path), "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["source"]["kind"] == "db" and result["source"]["points"] == 72
    assert [r["n"] for r in result["rows"]] == [50, 72]
    assert all(r["dim"] == dim and r["queries"] == 10 for r in result["rows"])
