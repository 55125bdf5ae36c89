"""heisd-bench decode with --db: the hybrid methods on demonstration steps."""

from __future__ import annotations

import json

import torch

from heisd_ros.models.checkpoint import load_small_vla, save_draft_head
from heisd_ros.models.draft_head import DraftHead, DraftHeadConfig
from heisd_ros.tools import bench, build_db


def test_bench_decode_with_hybrid_modes(demos, tiny_target_path, tmp_path, capsys):
    db = tmp_path / "db"
    assert build_db.main(["--demos", str(demos), "--db", str(db), "--target", tiny_target_path,
                          "--router-window", "3", "--exact", "--hold-out-every", "3"]) == 0
    target = load_small_vla(tiny_target_path)
    torch.manual_seed(0)
    head = save_draft_head(DraftHead(DraftHeadConfig.for_target(target)),
                           tmp_path / "head.safetensors", target)
    out = tmp_path / "bench.json"
    assert bench.main(["decode", "--target", tiny_target_path, "--drafter", str(head),
                       "--db", str(db), "--exact", "--observations", "6", "--warmup", "1",
                       "--deadline-ms", "0", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    modes = result["modes"]
    assert list(modes) == ["ar", "drafter", "drafter_relaxed", "retrieval", "router_only",
                           "router_skip", "heisd", "heisd_paper"]
    for lossless in ("retrieval", "router_only"):
        assert modes[lossless]["agreement_with_ar"]["exact_token_rate"] == 1.0
    assert modes["router_only"]["hybrid"]["skip_rate"] == 0.0
    assert 0.0 <= modes["heisd"]["hybrid"]["router_retrieval_share"] <= 1.0
    assert "hybrid" not in modes["ar"]
    assert "router->retr" in capsys.readouterr().out


def test_bench_retrieval_small(tmp_path, capsys):
    out = tmp_path / "retrieval.json"
    assert bench.main(["retrieval", "--sizes", "400", "--dims", "32", "--queries", "10",
                       "--ef", "16,128", "--workdir", str(tmp_path), "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["backend"], r["hnsw_ef"]) for r in rows] == [
        ("edge-hnsw", 16), ("edge-hnsw", 128), ("qdrant-local", None)]
    assert rows[-1]["recall_at_8"] == 1.0                       # brute force
    assert all(r["latency_ms"]["p99"] >= r["latency_ms"]["median"] > 0 for r in rows)
    assert rows[0]["reopen_s"] > 0
    # the DB on disk holds at least the 400 float32 vectors of 32 dimensions
    assert rows[0]["disk_mb"] >= 400 * 32 * 4 / 2**20
    assert "recall@8" in capsys.readouterr().out
    vecs = bench.demo_shaped_vectors(300, 16, seed=1)
    assert vecs.shape == (300, 16) and abs(float((vecs ** 2).sum(1).mean()) - 1) < 1e-5
