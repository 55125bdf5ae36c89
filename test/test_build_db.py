"""heisd-build-db: end to end on tiny synthetic demos; refuses a DB of another model/dimension."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from heisd_ros.data.npz_episodes import episode_path, save_episode
from heisd_ros.models.checkpoint import load_small_vla
from heisd_ros.retrieval.embedding import (
    embed_observation,
    embedding_from_features,
    model_fingerprint,
)
from heisd_ros.retrieval.errors import MetadataMismatchError
from heisd_ros.retrieval.retriever import Retriever
from heisd_ros.retrieval.store import open_store
from heisd_ros.retrieval.store_config import StoreConfig
from heisd_ros.tools import build_db
from test.fixtures_decoding import TINY, scenes
from test.fixtures_demos import T_STEPS, synth_episode


def run(demos, db, checkpoint, *extra):
    return build_db.main(["--demos", str(demos), "--db", str(db), "--target", str(checkpoint),
                          "--router-window", "3", "--exact", "--hold-out-every", "0", *extra])


def test_end_to_end_build_and_retrieve(demos, tiny_target_path, tmp_path):
    db = tmp_path / "db"
    assert run(demos, db, tiny_target_path) == 0
    stats = json.loads((db / "offline_stats.json").read_text())
    assert stats["points"] == 3 * T_STEPS and stats["tasks"] == ["task_a", "task_b"]
    assert stats["shared_collections"] == {}
    assert stats["index"]["quantization"] == "none" and "points < 100000" in \
        stats["index"]["reason"]
    assert stats["router_stats"]["suite_a"]["n_windows"] == 3 * (T_STEPS - 2)
    target = load_small_vla(tiny_target_path)
    assert stats["model_fingerprint"] == model_fingerprint(target)
    store = open_store(StoreConfig(path=str(db), exact_search=True),
                       dimension=stats["dimension"], model_fingerprint=stats["model_fingerprint"])
    try:
        assert store.count("task_a") == 2 * T_STEPS and store.count("task_b") == T_STEPS
        from heisd_ros.data.npz_episodes import iter_episode_paths, load_episode

        record = load_episode(iter_episode_paths(demos, tasks=["task_b"])[0])
        query = embed_observation(target, record.observation(3))
        res = Retriever(store).retrieve("task_b", query, k=2)
        assert res.ok and res.candidates[0].record.step == 3
        assert res.candidates[0].score == pytest.approx(1.0, abs=1e-4)
        assert len(res.candidates[0].record.lookahead_bins) == 3
    finally:
        store.close()


def test_one_task_name_in_two_suites_is_reported(tiny_target_path, tmp_path, capsys):
    root = tmp_path / "demos"
    for i, suite in enumerate(["suite_a", "suite_b"]):
        record = dataclasses.replace(synth_episode("task_a", 50 + i), suite=suite)
        save_episode(record, episode_path(root, suite, "task_a", i))
    assert run(root, tmp_path / "db", tiny_target_path) == 0
    stats = json.loads((tmp_path / "db" / "offline_stats.json").read_text())
    assert stats["tasks"] == ["task_a"]
    assert stats["shared_collections"] == {"task_a": ["suite_a", "suite_b"]}
    err = capsys.readouterr().err
    assert "suites suite_a, suite_b each have a task named 'task_a'" in err


def test_refuses_other_fingerprint_and_dimension(demos, tiny_target_path, tmp_path, capsys):
    db = tmp_path / "db"
    open_store(StoreConfig(path=str(db)), create=True, dimension=TINY.vision_dim * 2,
               model_fingerprint="some-other-model").close()
    assert run(demos, db, tiny_target_path, "--max-episodes", "1") == 2
    err = capsys.readouterr().err
    assert "incompatible DB" in err and "model_fingerprint" in err
    db2 = tmp_path / "db2"
    target = load_small_vla(tiny_target_path)
    open_store(StoreConfig(path=str(db2)), create=True, dimension=7,
               model_fingerprint=model_fingerprint(target)).close()
    assert run(demos, db2, tiny_target_path, "--max-episodes", "1") == 2
    assert "dimension" in capsys.readouterr().err
    with pytest.raises(MetadataMismatchError, match="model_fingerprint"):
        open_store(StoreConfig(path=str(db)), model_fingerprint=model_fingerprint(target))


def test_embedding_is_unit_and_fingerprint_tracks_weights(tiny_random_vla):
    obs = scenes(1, seed=3)[0]
    emb = embed_observation(tiny_random_vla, obs)
    assert emb.shape == (2 * TINY.vision_dim,) and np.linalg.norm(emb) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="features"):
        embedding_from_features(np.zeros((2, 4)))
    from heisd_ros.models.small_vla import SmallVLA

    other = SmallVLA.random(TINY, seed=99)
    assert model_fingerprint(other) != model_fingerprint(tiny_random_vla)
    assert model_fingerprint(tiny_random_vla) == model_fingerprint(tiny_random_vla)


def test_the_index_is_chosen_by_size_and_options_given_win(tmp_path):
    base = ["--demos", str(tmp_path), "--db", str(tmp_path / "db")]
    config, index = build_db._store_config(build_db.parse_args(base), 40_000)
    assert (config.vector_datatype, config.quantization, config.centering) == \
        ("float32", "none", False)
    assert "40000 points < 100000" in index["reason"]
    config, index = build_db._store_config(build_db.parse_args(base), 273_000)
    assert (config.vector_datatype, config.quantization, config.centering) == \
        ("float16", "int8", True)
    assert (config.hnsw_m, config.hnsw_ef_construct) == (32, 200)
    assert "large-DB index" in index["reason"] and "store.hnsw_ef 64 >= 48" in index["reason"]
    config, index = build_db._store_config(build_db.parse_args(
        [*base, "--vector-datatype", "float32", "--centering", "off", "--hnsw-m", "24"]),
        273_000)
    assert (config.vector_datatype, config.quantization, config.centering) == \
        ("float32", "int8", False)
    assert config.hnsw_m == 24 and "given on the command line: vector_datatype float32" in \
        index["reason"]
    with pytest.raises(SystemExit):
        build_db.parse_args([*base, "--quantization", "int4"])


def test_a_centred_int8_db_retrieves_the_same_step_as_a_plain_one(demos, tiny_target_path,
                                                                 tmp_path, capsys):
    assert run(demos, tmp_path / "c", tiny_target_path, "--centering", "on", "--quantization",
               "int8") == 0
    assert "given on the command line: quantization int8, centering True" in \
        capsys.readouterr().err
    target = load_small_vla(tiny_target_path)
    from heisd_ros.data.npz_episodes import iter_episode_paths, load_episode

    record = load_episode(iter_episode_paths(demos, tasks=["task_b"])[0])
    query = embed_observation(target, record.observation(3))
    with open_store(StoreConfig(path=str(tmp_path / "c"))) as store:
        assert store.centered
        res = Retriever(store).retrieve("task_b", query, k=2)
    assert res.ok and res.candidates[0].record.step == 3
    assert res.candidates[0].score == pytest.approx(1.0, abs=1e-4)
