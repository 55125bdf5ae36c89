"""heisd-collect end to end: npz + MCAP written, summary counts kept and dropped episodes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import numpy as np
import pytest

from heisd_ros.data.npz_episodes import iter_episode_paths, iter_steps, load_episode
from heisd_ros.data.rosbag_io import (
    TOPIC_TYPES,
    TOPIC_WRIST,
    bag_topic_summary,
    image_from_msg,
    read_bag_messages,
)
from heisd_ros.sim.collection import (
    CollectConfig,
    CollectionStopped,
    bag_path,
    collect,
    dataset_summary,
)
from heisd_ros.sim.config import SimConfig
from heisd_ros.tools.collect import main
from test.polling import wait_until


def test_collect_writes_npz_and_mcap_that_read_back(tmp_path, capsys):
    out = tmp_path / "demos"
    code = main(["--suites", "piper_goal", "--tasks", "stack_blue_on_red", "--episodes", "2",
                 "--seed", "4", "--format", "both", "--image-size", "64", "--out", str(out)])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    entry = summary["tasks"]["piper_goal/stack_blue_on_red"]
    assert entry["attempted"] == 2 and entry["kept"] + entry["dropped"] == 2
    assert entry["kept"] >= 1
    assert "kept" in capsys.readouterr().out

    paths = iter_episode_paths(out)
    assert len(paths) == entry["kept"]
    record = load_episode(paths[0])
    assert record.success and record.step_success[-1] and not record.step_success[:-1].any()
    assert record.image_third_person.shape[1:] == (64, 64, 3)
    obs, action = next(iter(iter_steps(paths[0])))
    assert obs.instruction == "stack the blue block on the red block" and action.shape == (7,)

    bag = bag_path(out, "piper_goal", "stack_blue_on_red", record.seed)
    assert list(bag.glob("*.mcap"))
    counts = bag_topic_summary(bag)
    assert set(counts) == set(TOPIC_TYPES)
    assert all(count == record.num_steps for _, count in counts.values())
    assert all(counts[t][0] == msgtype for t, msgtype in TOPIC_TYPES.items())
    frames = [msg for _, _, msg in read_bag_messages(bag, topics=[TOPIC_WRIST])]
    assert np.array_equal(image_from_msg(frames[-1]), record.image_wrist[-1])

    # Existing outputs are refused before any simulation runs, unless --overwrite.
    again = ["--suites", "piper_goal", "--tasks", "stack_blue_on_red", "--episodes", "2",
             "--seed", "4", "--format", "both", "--image-size", "64", "--out", str(out)]
    assert main(again) == 2
    assert "already exists" in capsys.readouterr().err


def test_failed_expert_episodes_are_dropped_and_counted(tmp_path):
    out = tmp_path / "demos"
    # Three steps are far too few for any pick-and-place: every attempt fails.
    code = main(["--suites", "piper_spatial", "--tasks", "block_left_of_plate", "--episodes", "2",
                 "--max-steps", "3", "--image-size", "32", "--out", str(out)])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["total_kept"] == 0 and summary["total_dropped"] == 2
    assert summary["tasks"]["piper_spatial/block_left_of_plate"]["dropped_seeds"] == [0, 1]
    assert iter_episode_paths(out) == []


def test_collect_config_names_bad_fields():
    with pytest.raises(ValueError, match="piper_goal"):
        CollectConfig(suites=("nope",))
    with pytest.raises(ValueError, match="tasks"):
        CollectConfig(suites=("piper_goal",), tasks=("block_left_of_plate",))
    with pytest.raises(ValueError, match="fmt"):
        CollectConfig(suites=("piper_goal",), fmt="hdf5")
    with pytest.raises(SystemExit):
        main(["--suites", "piper_goal", "--format", "hdf5"])


def test_the_expert_of_the_first_datasets_can_still_be_collected(tmp_path, capsys):
    """The expert options reproduce the expert of the first datasets."""
    out = tmp_path / "demos"
    args = ["--suites", "piper_goal", "--tasks", "red_block_on_plate", "--episodes", "1",
            "--image-size", "32", "--out", str(out)]
    assert main([*args, "--transit-head-start", "0", "--gripper-lead-steps", "0",
                 "--grasp-wait-steps", "5", "--release-wait-steps", "4"]) == 0
    record = load_episode(iter_episode_paths(out)[0])
    expert = record.metadata["expert_config"]
    assert expert["transit_head_start"] == 0.0 and expert["gripper_lead_steps"] == 0
    assert expert["grasp_wait_steps"] == 5 and expert["release_wait_steps"] == 4
    # The first datasets' expert holds still after closing the gripper: 5 still labels.
    still = np.linalg.norm(record.action[:, :3], axis=1) < 1e-4
    assert still.sum() >= 5
    # From rest the first step of the first transit barely moves (waypoint noise only); the
    # default expert's first step already has speed.
    assert np.linalg.norm(record.action[0, :3]) < 0.002
    assert main([*args, "--overwrite"]) == 0
    default = load_episode(iter_episode_paths(out)[0])
    assert np.linalg.norm(default.action[0, :3]) > 0.003
    assert main([*args, "--overwrite", "--transit-head-start", "0.7"]) == 2
    assert "transit_head_start" in capsys.readouterr().err


def test_execution_noise_perturbs_the_arm_and_keeps_the_experts_labels():
    """DART: the arm executes label + noise, the record keeps the expert's corrective label."""
    from heisd_ros.sim.config import SimConfig
    from heisd_ros.sim.demos import ExecutionNoise, record_expert_episode
    from heisd_ros.sim.env import PiperSimEnv
    from heisd_ros.sim.expert import ScriptedExpert
    from heisd_ros.sim.suites import get_task

    noise = ExecutionNoise(translation_m=0.004, rotation_rad=0.03)
    with PiperSimEnv(get_task("piper_goal", "red_block_on_plate"),
                     SimConfig(image_width_px=32, image_height_px=32)) as env:
        expert = ScriptedExpert(env)
        clean = record_expert_episode(env, expert, seed=7)
        noisy = record_expert_episode(env, expert, seed=7, noise=noise)
    assert clean.success and noisy.success
    assert noisy.metadata["execution_noise"] == {"translation_m": 0.004, "rotation_rad": 0.03,
                                                 "kick_probability": 0.0, "kick_m": 0.0}
    np.testing.assert_array_equal(noisy.action[0], clean.action[0])  # nothing seen yet
    assert not np.allclose(noisy.action[1:10], clean.action[1:10])

    def tracking_error_m(record):
        # How far the executed EE motion is from the recorded label, per step (m).
        moved = np.diff(record.ee_position_m, axis=0)
        return np.median(np.linalg.norm(moved - record.action[:-1, :3], axis=1))

    # The arm does not follow the labels of the noisy record, and the labels correct it:
    # label[t + 1] = planned increment - noise[t], so the change of label after a step
    # points back against what that step's noise did to the arm.
    assert tracking_error_m(noisy) > 2 * tracking_error_m(clean) + 0.002
    error = np.diff(noisy.ee_position_m, axis=0)[:-1] - noisy.action[:-2, :3]
    change = np.diff(noisy.action[:-1, :3], axis=0)
    assert np.mean(np.sum(error * change, axis=1) < 0) > 0.7
    assert set(np.unique(noisy.action[:, 6])) <= {0.0, 1.0}
    with pytest.raises(ValueError, match="translation_m"):
        ExecutionNoise(translation_m=-1.0)


def test_kicks_put_the_arm_centimetres_off_and_the_next_label_brings_it_back():
    """A kick moves the executed arm far from the label; the expert's next label undoes it."""
    from heisd_ros.sim.config import SimConfig
    from heisd_ros.sim.demos import ExecutionNoise, record_expert_episode
    from heisd_ros.sim.env import PiperSimEnv
    from heisd_ros.sim.expert import ScriptedExpert
    from heisd_ros.sim.suites import get_task

    noise = ExecutionNoise(kick_probability=0.1, kick_m=0.015)
    with PiperSimEnv(get_task("piper_goal", "red_block_on_plate"),
                     SimConfig(image_width_px=32, image_height_px=32)) as env:
        record = record_expert_episode(env, ScriptedExpert(env), seed=3, noise=noise)
    # error[t]: how far step t's executed motion was from its label (the kick, if any).
    error = np.diff(record.ee_position_m, axis=0)[:-1] - record.action[:-2, :3]
    kicked = np.linalg.norm(error, axis=1) > 0.01
    assert 2 <= kicked.sum() <= 0.3 * len(error)
    # The label after a kick turns against it: label[t + 1] - label[t] ~ -kick[t].
    change = np.diff(record.action[:-1, :3], axis=0)
    cosine = np.sum(error * change, axis=1) / (
        np.linalg.norm(error, axis=1) * np.linalg.norm(change, axis=1) + 1e-12)
    assert np.all(cosine[kicked] < -0.7)
    # Without kicks the same seed draws the same small noise as before kicks existed.
    small = ExecutionNoise(translation_m=0.003, rotation_rad=0.003)
    a = small.sample(np.random.default_rng(5))
    b = ExecutionNoise(0.003, 0.003, 0.0, 0.0).sample(np.random.default_rng(5))
    np.testing.assert_array_equal(a, b)
    for bad in ({"kick_probability": 1.5, "kick_m": 0.01}, {"kick_probability": 0.1},
                {"kick_m": 0.01}, {"kick_probability": 0.1, "kick_m": float("nan")}):
        with pytest.raises(ValueError, match="kick"):
            ExecutionNoise(**bad)


def test_runs_into_one_folder_are_merged_in_its_summary(tmp_path):
    out = tmp_path / "demos"
    # Three steps are far too few for a pick-and-place: every attempt fails, quickly.
    common = ["--suites", "piper_spatial", "--tasks", "block_left_of_plate", "--max-steps", "3",
              "--image-size", "32", "--out", str(out)]
    assert main(common + ["--episodes", "2", "--seed", "0"]) == 0
    assert main(common + ["--episodes", "1", "--seed", "5", "--grasp-wait-steps", "5"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    entry = summary["tasks"]["piper_spatial/block_left_of_plate"]
    assert entry["attempted"] == 3 and entry["dropped_seeds"] == [0, 1, 5]
    assert summary["total_dropped"] == 3
    assert [run["seed"] for run in summary["runs"]] == [0, 5]
    # Each run keeps the expert that collected it.
    assert [run["expert"]["grasp_wait_steps"] for run in summary["runs"]] == [0, 5]

    # Re-running the first collection replaces its entry instead of counting it twice.
    assert main(common + ["--episodes", "2", "--seed", "0", "--overwrite"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tasks"]["piper_spatial/block_left_of_plate"]["attempted"] == 3
    assert sorted(run["seed"] for run in summary["runs"]) == [0, 5]


def test_a_summary_from_before_runs_were_listed_counts_as_one_run():
    old = {"seed": 0, "out_dir": "d", "tasks": {"s/t": {"attempted": 2, "kept": 2, "dropped": 0,
                                                       "dropped_seeds": [], "mean_steps": 10.0}}}
    new = {"seed": 2, "out_dir": "d", "tasks": {"s/t": {"attempted": 2, "kept": 1, "dropped": 1,
                                                       "dropped_seeds": [3], "mean_steps": 40.0}}}
    merged = dataset_summary(old, new)
    assert merged["runs"] == [old, new]
    assert merged["tasks"]["s/t"] == {"attempted": 4, "kept": 3, "dropped": 1,
                                      "dropped_seeds": [3], "mean_steps": 20.0}
    assert (merged["total_kept"], merged["total_dropped"]) == (3, 1)


def test_a_collection_stopped_part_way_counts_the_attempts_that_finished(tmp_path):
    config = CollectConfig(suites=("piper_spatial",),
                           tasks=("block_left_of_plate", "block_right_of_plate"), episodes=3,
                           seed=7, out_dir=str(tmp_path / "demos"), max_steps=3)
    finished = []

    def progress(suite: str, task: str, seed: int, kept: bool) -> None:
        finished.append((task, seed))
        if len(finished) == 4:  # the second attempt of the second task
            raise KeyboardInterrupt

    with pytest.raises(CollectionStopped) as stop:
        collect(config, SimConfig(image_width_px=32, image_height_px=32), progress=progress)
    summary = stop.value.summary
    assert summary["tasks"]["piper_spatial/block_left_of_plate"]["dropped_seeds"] == [7, 8, 9]
    right = summary["tasks"]["piper_spatial/block_right_of_plate"]
    assert right["attempted"] == 1 and right["dropped_seeds"] == [7]
    assert summary["stopped_at"] == {"suite": "piper_spatial", "task": "block_right_of_plate",
                                     "seed": 8}
    assert summary["total_dropped"] == 4
    assert isinstance(stop.value, KeyboardInterrupt)  # Ctrl-C still ends the caller


def test_heisd_collect_stopped_by_sigterm_writes_its_summary(tmp_path):
    out = tmp_path / "demos"
    proc = subprocess.Popen(
        [sys.executable, "-m", "heisd_ros.tools.collect", "--suites", "piper_goal", "--tasks",
         "stack_blue_on_red", "--episodes", "40", "--seed", "4", "--image-size", "32",
         "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: iter_episode_paths(out) if out.is_dir() else False,
                          timeout_s=300.0), "no episode was written"
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120.0)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert "stopped part-way at piper_goal/stack_blue_on_red" in stderr
    summary = json.loads((out / "summary.json").read_text())
    entry = summary["tasks"]["piper_goal/stack_blue_on_red"]
    written = iter_episode_paths(out)
    assert entry["kept"] == len(written) >= 1
    assert entry["attempted"] == entry["kept"] + entry["dropped"] < 40
    assert summary["runs"][0]["stopped_at"]["seed"] == 4 + entry["attempted"]
    assert "kept" in stdout
