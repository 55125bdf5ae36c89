"""The compact .npz episode format round-trips and reads back as (Observation, action)."""

from __future__ import annotations

import numpy as np
import pytest

from heisd_ros.data.episode import EpisodeRecord, EpisodeRecorder, make_proprio
from heisd_ros.data.npz_episodes import (
    episode_path,
    iter_dataset,
    iter_episode_paths,
    iter_steps,
    load_episode,
    save_episode,
)
from heisd_ros.data.observation import Observation


def synthetic_record(steps: int = 5, size: int = 16, seed: int = 0,
                     task: str = "t") -> EpisodeRecord:
    rng = np.random.default_rng(seed)
    recorder = EpisodeRecorder("suite_a", task, "put the red block on the plate", seed, 10.0,
                               metadata={"source": "test"})
    for t in range(steps):
        recorder.add(image_third_person=rng.integers(0, 256, (size, size, 3), dtype=np.uint8),
                     image_wrist=rng.integers(0, 256, (size, size, 3), dtype=np.uint8),
                     joint_positions_rad=rng.normal(size=6), gripper_width_m=0.07,
                     ee_position_m=rng.normal(size=3), ee_rpy_rad=rng.normal(size=3),
                     ee_quat_xyzw=(0.0, 0.0, 0.0, 1.0), action=rng.normal(size=7) * 0.01,
                     stamp_s=0.1 * t, success=t == steps - 1)
    return recorder.finish(success=True)


def test_round_trip_is_exact(tmp_path):
    record = synthetic_record()
    path = save_episode(record, episode_path(tmp_path, record.suite, record.task, record.seed))
    assert path == tmp_path / "suite_a" / "t" / "episode_000000.npz"
    back = load_episode(path)
    for name in ("image_third_person", "image_wrist", "joint_positions_rad", "gripper_width_m",
                 "ee_position_m", "ee_rpy_rad", "ee_quat_xyzw", "action", "stamp_s",
                 "step_success"):
        got, want = getattr(back, name), getattr(record, name)
        assert got.dtype == want.dtype and np.array_equal(got, want), name
    assert (back.suite, back.task, back.instruction, back.seed, back.success) == \
        (record.suite, record.task, record.instruction, record.seed, True)
    assert back.metadata == {"source": "test"} and back.control_rate_hz == 10.0
    assert back.image_wrist.dtype == np.uint8
    assert not list(tmp_path.rglob("*.tmp.npz"))


def test_iter_steps_yields_observations_and_actions(tmp_path):
    record = synthetic_record(steps=4)
    path = save_episode(record, tmp_path / "s" / "t" / "episode_000000.npz")
    steps = list(iter_steps(path))
    assert len(steps) == 4
    obs, action = steps[2]
    assert isinstance(obs, Observation)
    assert np.array_equal(obs.image_primary, record.image_third_person[2])
    assert np.array_equal(obs.image_wrist, record.image_wrist[2])
    assert obs.instruction == record.instruction and obs.stamp_s == pytest.approx(0.2)
    np.testing.assert_allclose(obs.proprio, make_proprio(record.ee_position_m[2],
                                                         record.ee_rpy_rad[2], 0.07))
    assert action.shape == (7,) and action.dtype == np.float64
    np.testing.assert_allclose(action, record.action[2], rtol=1e-6)


def test_dataset_listing_filters(tmp_path):
    for task in ("a", "b"):
        for seed in (0, 1):
            rec = synthetic_record(steps=2, seed=seed, task=task)
            save_episode(rec, episode_path(tmp_path, rec.suite, task, seed))
    assert len(iter_episode_paths(tmp_path)) == 4
    assert [p.parent.name for p in iter_episode_paths(tmp_path, tasks=["b"])] == ["b", "b"]
    assert iter_episode_paths(tmp_path, suites=["other"]) == []
    assert sum(1 for _ in iter_dataset(tmp_path, tasks=["a"])) == 4


def test_bad_inputs_are_rejected(tmp_path):
    record = synthetic_record(steps=3)
    with pytest.raises(ValueError, match="joint_positions_rad"):
        EpisodeRecord(**{**record.__dict__, "joint_positions_rad": record.joint_positions_rad[:2]})
    with pytest.raises(ValueError, match="image_wrist"):
        EpisodeRecord(**{**record.__dict__, "image_wrist": record.image_wrist.astype(np.float32)})
    bogus = tmp_path / "x.npz"
    np.savez(bogus, a=np.zeros(2))
    with pytest.raises(ValueError, match="missing keys"):
        load_episode(bogus)
    with pytest.raises(ValueError, match="not a directory"):
        iter_episode_paths(tmp_path / "nope")
