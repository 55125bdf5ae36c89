"""A policy's own episodes as data (``heisd-collect --policy-rollouts``).

The recorded label is the action the policy executed, so a DB built from them drafts what the
target itself did. The policies here are real: the scripted expert run as a policy (its
rollout must equal its demonstration), the expert sent to the wrong object (a failure), and
the shipped small VLA through the CLI.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from heisd_ros.data.npz_episodes import iter_episode_paths, load_episode
from heisd_ros.sim.collection import CollectConfig, collect
from heisd_ros.sim.config import SimConfig
from heisd_ros.sim.demos import ExecutionNoise, record_expert_episode, record_policy_episode
from heisd_ros.sim.env import PiperSimEnv
from heisd_ros.sim.expert import ScriptedExpert
from heisd_ros.sim.suites import get_task
from test.test_expert_takeover import ExpertUntil

SHIPPED_VLA = Path(__file__).resolve().parents[1] / "heisd_ros/assets/small_vla.safetensors"
SMALL = SimConfig(image_width_px=32, image_height_px=32)


class ExpertPolicy(ExpertUntil):
    """The scripted expert as a policy, with the ``task`` attribute collect() sets."""

    task = None


def test_the_experts_rollout_as_a_policy_is_its_demonstration():
    with PiperSimEnv(get_task("piper_goal", "red_block_on_plate"), SMALL) as env:
        demo = record_expert_episode(env, ScriptedExpert(env), 3)
        rollout = record_policy_episode(env, ExpertPolicy(env), 3)
    assert demo.success and rollout.success
    assert rollout.num_steps == demo.num_steps
    # the same states, and each label is the action executed from that state
    assert np.allclose(rollout.ee_position_m, demo.ee_position_m)
    assert np.allclose(rollout.joint_positions_rad, demo.joint_positions_rad)
    assert np.allclose(rollout.action, demo.action)
    assert np.array_equal(rollout.image_third_person, demo.image_third_person)
    assert rollout.metadata["source"] == "policy_rollout"


def test_a_failed_rollout_runs_to_the_step_limit_and_is_dropped(tmp_path):
    task = get_task("piper_object", "green_can_in_basket")
    with PiperSimEnv(task, SMALL) as env:
        record = record_policy_episode(env, ExpertPolicy(env, pick="red_block"), 0, max_steps=30)
    assert not record.success and record.num_steps == 30
    config = CollectConfig(suites=("piper_object",), tasks=("green_can_in_basket",),
                           episodes=1, seed=0, out_dir=str(tmp_path / "r"), max_steps=30,
                           policy_rollouts=True)
    with PiperSimEnv(task, SMALL) as env:
        policy = ExpertPolicy(env, pick="red_block")
        summary = collect(config, SMALL, policy=policy, policy_description="wrong object")
    assert policy.task == "green_can_in_basket"
    assert summary["total_kept"] == 0 and summary["total_dropped"] == 1
    assert summary["policy_rollouts"] == "wrong object" and summary["takeover"] is None
    assert not list((tmp_path / "r").rglob("*.npz"))


class Replay:
    """A policy that plays back a recorded action sequence, open loop."""

    task = None

    def __init__(self, actions: np.ndarray) -> None:
        self.actions, self.step = actions, 0

    def reset(self) -> None:
        self.step = 0

    def act(self, observation):
        self.step += 1
        return self.actions[min(self.step, len(self.actions)) - 1]


def test_collect_keeps_the_policys_successful_episodes(tmp_path):
    with PiperSimEnv(get_task("piper_goal", "red_block_on_plate"), SMALL) as env:
        demo = record_expert_episode(env, ScriptedExpert(env), 3)
    assert demo.success
    config = CollectConfig(suites=("piper_goal",), tasks=("red_block_on_plate",), episodes=1,
                           seed=3, out_dir=str(tmp_path / "r"), policy_rollouts=True)
    # collect runs its own simulator: the demonstration's actions, played back, succeed there
    summary = collect(config, SMALL, policy=Replay(demo.action), policy_description="replay")
    assert summary["tasks"]["piper_goal/red_block_on_plate"]["kept"] == 1
    [path] = iter_episode_paths(tmp_path / "r")
    episode = load_episode(path)
    assert episode.success and episode.metadata["source"] == "policy_rollout"
    assert np.allclose(episode.action, demo.action)


def test_policy_rollouts_refuse_a_take_over_noise_or_no_policy(tmp_path):
    with pytest.raises(ValueError, match="choose one"):
        CollectConfig(suites=("piper_goal",), policy_rollouts=True, takeover_steps=(5, 10))
    with pytest.raises(ValueError, match="execution noise"):
        CollectConfig(suites=("piper_goal",), policy_rollouts=True,
                      noise=ExecutionNoise(translation_m=0.003))
    config = CollectConfig(suites=("piper_goal",), episodes=1, out_dir=str(tmp_path / "r"),
                           policy_rollouts=True)
    with pytest.raises(ValueError, match="policy and takeover_steps or policy_rollouts"):
        collect(config, SMALL)


def test_heisd_collect_policy_rollouts_runs_the_small_vla(tmp_path, capsys):
    from heisd_ros.tools.collect import main

    out = tmp_path / "r"
    code = main(["--suites", "piper_goal", "--tasks", "red_block_on_plate", "--episodes", "1",
                 "--seed", "3", "--image-size", "128", "--max-steps", "4", "--out", str(out),
                 "--policy-rollouts", str(SHIPPED_VLA)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    # four steps cannot finish the task: counted as a failed policy episode, nothing written
    assert "dropped 1 failed policy episodes" in captured.out
    run = json.loads((out / "summary.json").read_text())["runs"][-1]
    assert run["policy_rollouts"].startswith("ar: ") and run["takeover"] is None
    assert not list(out.rglob("*.npz"))


def test_heisd_collect_refuses_two_policies_or_a_missing_one(tmp_path, capsys):
    from heisd_ros.tools.collect import main

    both = main(["--suites", "piper_goal", "--episodes", "1", "--out", str(tmp_path / "a"),
                 "--policy-rollouts", str(SHIPPED_VLA), "--takeover-policy", str(SHIPPED_VLA)])
    assert both == 2 and "choose one" in capsys.readouterr().err
    missing = main(["--suites", "piper_goal", "--episodes", "1", "--out", str(tmp_path / "b"),
                    "--policy-rollouts", str(tmp_path / "missing.safetensors")])
    assert missing == 2 and "--policy-rollouts" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
