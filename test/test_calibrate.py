"""Verify-skip calibration: threshold functions, and heisd-calibrate end to end on tiny demos."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from heisd_ros.calibration.verify_skip import (
    VerifySkipCalibration,
    best_precision,
    draft_passes,
    precision_threshold,
    youden_threshold,
)
from heisd_ros.data.observation import EpisodeState
from heisd_ros.decoding.builder import build_decoder
from heisd_ros.decoding.retrieval_accept import GroupAcceptConfig
from heisd_ros.tools import build_db, calibrate
from test.fixtures_decoding import scenes


def test_precision_threshold_is_the_lowest_that_qualifies():
    scores = np.array([0.99, 0.98, 0.97, 0.96, 0.95, 0.90])
    good = np.array([True, True, True, False, True, False])
    assert precision_threshold(scores, good, 1.0, 1) == (0.97, 1.0, 3)
    t, p, n = precision_threshold(scores, good, 0.8, 1)
    assert (t, n) == (0.95, 5) and p == pytest.approx(0.8)
    assert precision_threshold(scores, good, 1.0, 4)[0] == 1.0   # support too small: never


def test_best_precision_says_what_the_data_allows():
    scores = np.array([0.99, 0.98, 0.97, 0.96, 0.95, 0.90])
    good = np.array([False, True, True, False, True, False])
    prec, t, n = best_precision(scores, good, 1)
    assert (t, n) == (0.97, 3) and prec == pytest.approx(2 / 3)
    prec, t, n = best_precision(scores, good, 4)   # at least 4 steps: the best is 3 of 5
    assert (t, n) == (0.95, 5) and prec == pytest.approx(0.6)
    assert best_precision(scores, good, 7)[2] == 0   # fewer scores than the support asked for


def test_youden_separates():
    assert youden_threshold(np.array([0.1, 0.2, 0.7, 0.9, np.nan]),
                            np.array([False, False, True, True, True])) == 0.7
    assert youden_threshold(np.array([0.1, 0.2]), np.array([True, True])) == 0.5


def test_draft_passes_is_the_group_rule():
    cfg = GroupAcceptConfig()
    target = np.array([100, 100, 100, 50, 50, 50, 255])
    assert draft_passes(target + [10, 10, 10, 0, 0, 0, 0], target, cfg)
    assert not draft_passes(target + [11, 10, 10, 0, 0, 0, 0], target, cfg)  # sum 31
    assert not draft_passes(target - [0, 0, 0, 0, 0, 0, 1], target, cfg)     # gripper


def test_calibrate_end_to_end_and_load_into_hybrid(demos, tiny_target_path, tmp_path):
    db = tmp_path / "db"
    assert build_db.main(["--demos", str(demos), "--db", str(db), "--target", tiny_target_path,
                          "--router-window", "3", "--exact", "--hold-out-every", "2"]) == 0
    offline = json.loads((db / "offline_stats.json").read_text())
    assert len(offline["held_out_episodes"]) == 1
    out = tmp_path / "cal.json"
    assert calibrate.main(["--db", str(db), "--target", tiny_target_path, "--exact",
                           "--min-support", "2", "--out", str(out)]) == 0
    json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"non-JSON {c}"))
    cal = VerifySkipCalibration.load(out)
    assert cal.n_held_out_steps == 8 and 0.0 <= cal.router_threshold <= 1.0
    assert cal.model_fingerprint == offline["model_fingerprint"]
    from heisd_ros.decoder_loader import (
        DecoderOptions,
        load_resources,
        open_warm_store,
        resolve_router_stats,
    )
    from heisd_ros.models.checkpoint import load_small_vla
    from heisd_ros.retrieval.store_config import StoreConfig

    target = load_small_vla(tiny_target_path)
    # the loader reads the calibration (checked against the target) and the DB's statistics
    options = DecoderOptions(db_dir=str(db), calibration_path=str(out))
    loaded = load_resources(target, ["heisd"], options, store=open_warm_store(
        StoreConfig(path=str(db), exact_search=True), target))
    loaded.resources.router_stats = resolve_router_stats(options, suite="suite_a").path
    assert loaded.resources.router_stats == offline["router_stats"]["suite_a"]["path"]
    hybrid = build_decoder("heisd", loaded.resources)
    assert hybrid.skip_threshold == cal.skip_threshold
    assert hybrid.router.config.threshold == cal.router_threshold
    obs = replace(scenes(1, seed=40)[0], episode=EpisodeState("task_a"))
    got = hybrid.decode(obs)
    assert got.record.router_mode == 0 and got.stats.target_forwards >= 1   # short history


def test_calibrate_without_held_out_fails_clearly(demos, tiny_target_path, tmp_path, capsys):
    db = tmp_path / "db"
    assert build_db.main(["--demos", str(demos), "--db", str(db), "--target", tiny_target_path,
                          "--router-window", "3", "--exact", "--hold-out-every", "0",
                          "--max-episodes", "1"]) == 0
    assert calibrate.main(["--db", str(db), "--target", tiny_target_path]) == 2
    assert "held-out" in capsys.readouterr().err


def test_calibrate_reads_held_out_bags_as_the_db_build_read_them(demos, tiny_target_path,
                                                                 tmp_path):
    """A DB built from bags holds bag directories out; calibration reads them back alike."""
    from heisd_ros.data.npz_episodes import iter_episode_paths, load_episode
    from heisd_ros.data.rosbag_io import write_episode_bag

    for i, path in enumerate(iter_episode_paths(demos)):
        write_episode_bag(load_episode(path), tmp_path / "bags" / f"episode_{i}",
                          camera_format="png")  # only .../compressed cameras: found alike
    db = tmp_path / "db"
    assert build_db.main(["--demos", str(tmp_path / "bags"), "--db", str(db), "--target",
                          tiny_target_path, "--router-window", "3", "--exact",
                          "--hold-out-every", "2"]) == 0
    offline = json.loads((db / "offline_stats.json").read_text())
    assert offline["demos_format"] == "bag" and len(offline["held_out_episodes"]) == 1
    out = tmp_path / "cal.json"
    assert calibrate.main(["--db", str(db), "--target", tiny_target_path, "--exact",
                           "--min-support", "2", "--out", str(out)]) == 0
    assert VerifySkipCalibration.load(out).n_held_out_steps == 8


def test_calibrate_reads_the_router_statistics_of_a_moved_db(demos, tiny_target_path, tmp_path):
    db = tmp_path / "db"
    assert build_db.main(["--demos", str(demos), "--db", str(db), "--target", tiny_target_path,
                          "--router-window", "3", "--exact", "--hold-out-every", "2"]) == 0
    args = ["--target", tiny_target_path, "--exact", "--min-support", "2"]
    assert calibrate.main(["--db", str(db), *args, "--out", str(tmp_path / "here.json")]) == 0
    moved = db.rename(tmp_path / "moved")   # the build recorded paths under db/
    assert calibrate.main(["--db", str(moved), *args, "--out", str(tmp_path / "moved.json")]) \
        == 0
    here = VerifySkipCalibration.load(tmp_path / "here.json")
    there = VerifySkipCalibration.load(tmp_path / "moved.json")
    assert there.router_threshold == here.router_threshold


def test_calibrate_from_another_directory_finds_the_held_out_episodes(demos, tiny_target_path,
                                                                     tmp_path, monkeypatch,
                                                                     capsys):
    import shutil

    shutil.copytree(demos, tmp_path / "build" / "demos")
    monkeypatch.chdir(tmp_path / "build")  # the build names the demos relative to here
    assert build_db.main(["--demos", "demos", "--db", "db", "--target", tiny_target_path,
                          "--router-window", "3", "--exact", "--hold-out-every", "2"]) == 0
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    args = ["--db", str(tmp_path / "build" / "db"), "--target", tiny_target_path, "--exact",
            "--min-support", "2"]
    assert calibrate.main([*args, "--out", "cal.json"]) == 0
    assert VerifySkipCalibration.load("cal.json").n_held_out_steps == 8
    # the demos moved away: the tool says which episode and how to point at them
    (tmp_path / "build" / "demos").rename(tmp_path / "build" / "moved")
    capsys.readouterr()
    assert calibrate.main([*args, "--out", "again.json"]) == 2
    err = capsys.readouterr().err
    assert "held_out_episodes" in err and str(tmp_path / "build" / "demos") in err \
        and "--held-out" in err, err
    assert calibrate.main([*args, "--held-out", str(tmp_path / "build" / "moved"),
                           "--out", "again.json"]) == 0
