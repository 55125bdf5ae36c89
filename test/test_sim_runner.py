"""Closed-loop runner: policies plug in by argument; results carry success, steps and stats."""

from __future__ import annotations

import numpy as np
import pytest

from heisd_ros.data.observation import Observation
from heisd_ros.sim.config import SimConfig
from heisd_ros.sim.env import PiperSimEnv
from heisd_ros.sim.expert import ScriptedExpert
from heisd_ros.sim.runner import run_episodes
from heisd_ros.sim.suites import get_task

FAST = SimConfig(render=False)


def test_do_nothing_policy_fails_and_stats_are_collected():
    calls = []

    def policy(obs: Observation):
        calls.append(obs.instruction)
        return np.zeros(7), {"target_forwards": 7}

    results = run_episodes(policy, "piper_goal", "red_block_on_plate", n=2, seed=5, max_steps=6,
                           config=FAST)
    assert [e.seed for e in results.episodes] == [5, 6]
    assert results.successes == 0 and results.success_rate == 0.0
    assert all(e.steps == 6 and len(e.stats) == 6 for e in results.episodes)
    assert results.episodes[0].stats[0] == {"target_forwards": 7}
    assert calls[0] == "put the red block on the plate"
    assert all(e.limits == {} for e in results.episodes)


def test_a_policy_pushing_into_the_table_has_its_clamped_steps_counted():
    results = run_episodes(lambda obs: np.array([0, 0, -0.2, 0, 0, 0, 0]), "piper_goal",
                           "red_block_on_plate", n=1, seed=1, max_steps=8, config=FAST)
    limits = results.episodes[0].limits
    assert limits["step translation"] == 8 and limits["workspace"] >= 3, limits


def test_expert_as_policy_on_a_shared_env_succeeds_and_stops_early():
    spec = get_task("piper_goal", "red_block_on_plate")
    seen = []

    def observer(episode, step, obs, action, outcome):
        seen.append((episode, step, bool(outcome.success)))

    with PiperSimEnv(spec, FAST) as env:
        expert = ScriptedExpert(env)  # privileged: reads object poses from this env
        results = run_episodes(expert, "piper_goal", "red_block_on_plate", n=2, seed=3,
                               observer=observer, env=env)
        assert env.data is not None  # the caller's env is not closed by the runner
    assert results.successes == 2
    first = results.episodes[0]
    assert first.success and first.steps < spec.max_steps and first.stats == []
    assert (0, first.steps - 1, True) in seen


def test_env_for_another_task_is_rejected():
    with PiperSimEnv(get_task("piper_goal", "stack_blue_on_red"), FAST) as env:
        with pytest.raises(ValueError, match="env"):
            run_episodes(lambda obs: np.zeros(7), "piper_goal", "red_block_on_plate", n=1,
                         seed=0, env=env)


def test_bad_policies_are_rejected():
    with pytest.raises(ValueError, match="policy"):
        run_episodes(42, "piper_goal", "red_block_on_plate", n=1, seed=0, config=FAST)
    with pytest.raises(ValueError, match="action"):
        run_episodes(lambda obs: np.zeros(3), "piper_goal", "red_block_on_plate", n=1, seed=0,
                     max_steps=2, config=FAST)
    with pytest.raises(ValueError, match="suite"):
        run_episodes(lambda obs: np.zeros(7), "nope", "red_block_on_plate", n=1, seed=0)


def test_progress_stages_follow_the_expert_and_stay_false_for_a_still_policy():
    from heisd_ros.eval.metrics import first_goal_progress
    from heisd_ros.sim.progress import EpisodeProgress

    results = {}
    with PiperSimEnv(get_task("piper_goal", "red_block_on_plate"), FAST) as env:
        expert = ScriptedExpert(env)
        for name in ("expert", "still"):
            obs = env.reset(3)
            expert.reset(3)
            tracker = EpisodeProgress(env)
            for _ in range(get_task("piper_goal", "red_block_on_plate").max_steps):
                action = expert.act(obs) if name == "expert" else np.zeros(7)
                outcome = env.step(action)
                tracker.update(action)
                obs = outcome.observation
                if outcome.success or (name == "still" and env.step_index > 30):
                    break
            results[name] = tracker.result()
    assert results["expert"] == {"red_block": {"reached": True, "grasped": True, "lifted": True}}
    assert results["still"] == {"red_block": {"reached": False, "grasped": False,
                                              "lifted": False}}
    rates = first_goal_progress([results["expert"], results["still"], {}])
    assert rates == {"reached": 0.5, "grasped": 0.5, "lifted": 0.5}
    assert first_goal_progress([{}]) == {}
