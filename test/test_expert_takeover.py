"""The expert taking over mid-episode (DAgger-style data) and heisd-collect's take-over runs.

The expert finishes from whatever state a policy left; only its part is recorded.

The states are made by real simulation: the expert's own script run part-way, or an expert
sent to the wrong object (what the small VLA does in piper_object), never hand-set.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from heisd_ros.data.npz_episodes import iter_episode_paths, load_episode
from heisd_ros.sim.collection import CollectConfig, collect, takeover_step
from heisd_ros.sim.config import SimConfig
from heisd_ros.sim.demos import record_expert_episode, record_takeover_episode
from heisd_ros.sim.env import PiperSimEnv
from heisd_ros.sim.expert import ScriptedExpert
from heisd_ros.sim.predicates import goal_satisfied
from heisd_ros.sim.suites import get_task

SHIPPED_VLA = Path(__file__).resolve().parents[1] / "heisd_ros/assets/small_vla.safetensors"
SMALL = SimConfig(image_width_px=32, image_height_px=32)


class ExpertUntil:
    """A policy: the expert's own actions (optionally for another object) until stopped."""

    def __init__(self, env: PiperSimEnv, pick: str | None = None) -> None:
        self.expert, self.pick = ScriptedExpert(env), pick

    def reset(self) -> None:
        self.expert.reset()
        if self.pick is not None:  # only the pick of this object, then hold it up
            self.expert._script = itertools.chain(
                self.expert._pick(self.pick), self.expert._hold(closed=True, steps=10_000))

    def act(self, observation):
        return self.expert.act(observation)


def test_take_over_while_carrying_the_goal_object_places_it():
    with PiperSimEnv(get_task("piper_goal", "red_block_on_plate"), SMALL) as env:
        policy = ExpertUntil(env)
        full = record_expert_episode(env, ScriptedExpert(env), 3)
        assert full.success
        # the step at which the block is first held, from the full demonstration's gripper
        closed_at = int(np.argmax(full.action[:, 6] > 0.5))
        result = record_takeover_episode(env, ScriptedExpert(env), policy, 3, closed_at + 8)
        assert result.record is not None and result.record.success
        assert result.policy_steps == closed_at + 8
        # it never opens the gripper before the place: the first label keeps it closed
        assert result.record.action[0, 6] == 1.0
        assert result.record.metadata["source"] == "expert_takeover"
        assert result.record.metadata["takeover_step"] == closed_at + 8


def test_take_over_from_the_wrong_object_lets_it_go_then_does_the_task():
    task = get_task("piper_object", "green_can_in_basket")
    with PiperSimEnv(task, SMALL) as env:
        policy = ExpertUntil(env, pick="red_block")
        successes = 0
        for seed in (0, 1):
            result = record_takeover_episode(env, ScriptedExpert(env), policy, seed, 90)
            record = result.record
            assert record is not None
            # the policy really held the red block when the expert took over
            assert record.gripper_width_m[0] < 0.06 and record.action[0, 6] == 0.0
            successes += record.success
            if record.success:
                assert goal_satisfied(env, task, task.goals[0])
        assert successes >= 1


def test_a_goal_that_already_holds_is_not_done_again():
    task = get_task("piper_long", "red_on_plate_and_blue_in_basket")
    with PiperSimEnv(task, SMALL) as env:
        full = record_expert_episode(env, ScriptedExpert(env), 2)
        assert full.success
        policy = ExpertUntil(env)
        # run the expert until its first goal holds and the gripper is open again
        env.reset(2)
        policy.reset()
        observation, steps = env.observe(), 0
        while not (goal_satisfied(env, task, task.goals[0]) and steps > 0
                   and env.gripper_width_command_m > 0.05):
            observation = env.step(policy.act(observation)).observation
            steps += 1
            assert steps < full.num_steps
        result = record_takeover_episode(env, ScriptedExpert(env), policy, 2, steps + 3)
        assert result.record is not None and result.record.success
        # the rest is one pick-and-place: far shorter than the whole two-stage episode, and
        # the red block (the first goal's) is never lifted again
        assert result.record.num_steps < full.num_steps - steps
        assert goal_satisfied(env, task, task.goals[0])


def test_unrecorded_steps_are_executed_but_left_out_of_the_record():
    with PiperSimEnv(get_task("piper_goal", "red_block_on_plate"), SMALL) as env:
        whole = record_takeover_episode(env, ScriptedExpert(env), ExpertUntil(env), 4, 12)
        part = record_takeover_episode(env, ScriptedExpert(env), ExpertUntil(env), 4, 12,
                                       unrecorded_steps=5)
        assert whole.record.success and part.record.success
        assert part.record.num_steps == whole.record.num_steps - 5
        # the same run, its first five expert steps cut: same states, same labels
        assert np.allclose(part.record.ee_position_m, whole.record.ee_position_m[5:])
        assert np.allclose(part.record.action, whole.record.action[5:])
        assert part.record.metadata["unrecorded_steps"] == 5
        with pytest.raises(ValueError, match="unrecorded_steps"):
            record_takeover_episode(env, ScriptedExpert(env), ExpertUntil(env), 4, 12,
                                    unrecorded_steps=-1)


def test_a_policy_that_finishes_before_the_take_over_leaves_nothing_to_record():
    with PiperSimEnv(get_task("piper_goal", "red_block_on_plate"), SMALL) as env:
        result = record_takeover_episode(env, ScriptedExpert(env), ExpertUntil(env), 5, 10_000)
        assert result.record is None and result.policy_succeeded
        assert 0 < result.policy_steps < 10_000
        # the step limit runs out within the policy's part, or the expert's unrecorded steps
        for limit, takeover, unrecorded in ((10, 10, 0), (10, 20, 0), (12, 10, 2), (12, 10, 5)):
            late = record_takeover_episode(env, ScriptedExpert(env), ExpertUntil(env), 5,
                                           takeover, max_steps=limit,
                                           unrecorded_steps=unrecorded)
            assert late.record is None and not late.policy_succeeded
            assert late.policy_steps == min(takeover, limit)
        # one step left to record
        one = record_takeover_episode(env, ScriptedExpert(env), ExpertUntil(env), 5, 10,
                                      max_steps=13, unrecorded_steps=2)
        assert one.record.num_steps == 1 and not one.record.success
        with pytest.raises(ValueError, match="takeover_step"):
            record_takeover_episode(env, ScriptedExpert(env), ExpertUntil(env), 5, -1)


def test_collect_with_a_takeover_policy_counts_and_describes_it(tmp_path):
    config = CollectConfig(suites=("piper_goal",), tasks=("red_block_on_plate",), episodes=2,
                           seed=7, out_dir=str(tmp_path / "d"), takeover_steps=(20, 40))
    steps = [takeover_step(config, s) for s in (7, 8)]
    assert all(20 <= s <= 40 for s in steps) and steps == [takeover_step(config, s)
                                                           for s in (7, 8)]

    class Policy(ExpertUntil):
        task = None

    with PiperSimEnv(get_task("piper_goal", "red_block_on_plate"), SMALL) as env:
        policy = Policy(env)
        summary = collect(config, SMALL, policy=policy, policy_description="expert")
    assert policy.task == "red_block_on_plate"
    assert summary["takeover"] == {"steps": [20, 40], "policy": "expert",
                                   "unrecorded_steps": 0}
    entry = summary["tasks"]["piper_goal/red_block_on_plate"]
    assert entry["kept"] >= 1 and entry["policy_succeeded_seeds"] == []
    paths = iter_episode_paths(tmp_path / "d")
    assert len(paths) == entry["kept"]
    meta = load_episode(paths[0]).metadata
    assert meta["source"] == "expert_takeover" and meta["takeover_step"] in steps
    with pytest.raises(ValueError, match="takeover_steps"):
        CollectConfig(suites=("piper_goal",), takeover_steps=(5, 2))
    with pytest.raises(ValueError, match="policy and takeover_steps"):
        collect(config, SMALL)


def test_heisd_collect_takeover_policy_runs_the_small_vla(tmp_path, capsys):
    from heisd_ros.tools.collect import main

    out = tmp_path / "t"
    code = main(["--suites", "piper_goal", "--tasks", "red_block_on_plate", "--episodes", "1",
                 "--seed", "3", "--image-size", "128", "--out", str(out),
                 "--takeover-policy", str(SHIPPED_VLA),
                 "--takeover-steps", "4", "4", "--takeover-unrecorded-steps", "2"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "nothing to record after the take-over" in captured.out
    summary = json.loads((out / "summary.json").read_text())
    run = summary["runs"][-1]
    assert run["takeover"]["steps"] == [4, 4] and run["takeover"]["policy"].startswith("ar: ")
    assert run["takeover"]["unrecorded_steps"] == 2
    for path in iter_episode_paths(out):
        meta = load_episode(path).metadata
        assert meta["policy_steps"] == 4 and meta["source"] == "expert_takeover"
        assert meta["unrecorded_steps"] == 2


def test_heisd_collect_names_a_missing_takeover_policy(tmp_path, capsys):
    from heisd_ros.tools.collect import main

    code = main(["--suites", "piper_goal", "--episodes", "1", "--out", str(tmp_path / "t"),
                 "--takeover-policy", str(tmp_path / "missing.safetensors")])
    assert code == 2
    assert "--takeover-policy" in capsys.readouterr().err and not (tmp_path / "t").exists()
