"""Task registry, physical success predicates, and the scripted experts on every task."""

from __future__ import annotations

import numpy as np
import pytest

from heisd_ros.sim.config import SimConfig
from heisd_ros.sim.env import PiperSimEnv
from heisd_ros.sim.expert import ExpertConfig, ScriptedExpert
from heisd_ros.sim.objects import ObjectSpec
from heisd_ros.sim.suites import get_task, list_suites, list_tasks
from heisd_ros.sim.tasks import Goal

NO_RENDER = SimConfig(render=False)
ALL_TASKS = [(suite, task) for suite in list_suites() for task in list_tasks(suite)]
HOLD = np.zeros(7)


def test_suites_have_the_promised_shape():
    assert set(list_suites()) == {"piper_spatial", "piper_object", "piper_goal", "piper_long",
                                  "piper_dynamic"}
    for suite in list_suites():
        assert len(list_tasks(suite)) >= 3
    assert all(len(get_task("piper_long", t).goals) == 2 for t in list_tasks("piper_long"))
    # Spatial: one object set, a different layout per task.
    spatial = [get_task("piper_spatial", t) for t in list_tasks("piper_spatial")]
    assert len({tuple(o.name for o in t.objects) for t in spatial}) == 1
    rng = np.random.default_rng(0)
    assert len({tuple(np.round(t.layout(rng)["plate"][:2], 1)) for t in spatial}) >= 3
    # Object: one skill, a different object per task. Goal: one scene, different goals.
    assert len({get_task("piper_object", t).goals[0].obj for t in list_tasks("piper_object")}) >= 3
    goal_tasks = [get_task("piper_goal", t) for t in list_tasks("piper_goal")]
    assert len({t.goals for t in goal_tasks}) == len(goal_tasks)
    for suite in list_suites():  # instructions tell a suite's tasks apart
        names = list_tasks(suite)
        assert len({get_task(suite, t).instruction for t in names}) == len(names)


def test_registry_errors_list_valid_names():
    with pytest.raises(ValueError, match="piper_spatial"):
        get_task("libero_spatial", "x")
    with pytest.raises(ValueError, match="red_block_on_plate"):
        get_task("piper_goal", "no_such_task")


def test_specs_validate_their_fields():
    with pytest.raises(ValueError, match="relation"):
        Goal("a", "under", "b")
    with pytest.raises(ValueError, match="shape"):
        ObjectSpec("x", "sphere", (0.02,), (1, 1, 1, 1))
    with pytest.raises(ValueError, match="half_size_m"):
        ObjectSpec("x", "box", (0.02, 0.02), (1, 1, 1, 1))


def test_layouts_are_seeded_and_vary():
    task = get_task("piper_object", "green_can_in_basket")
    a, b = task.layout(np.random.default_rng(3)), task.layout(np.random.default_rng(3))
    assert a == b
    assert a != task.layout(np.random.default_rng(4))


@pytest.mark.parametrize("suite,task", ALL_TASKS)
def test_doing_nothing_fails(suite, task):
    spec = get_task(suite, task)
    with PiperSimEnv(spec, NO_RENDER) as env:
        env.reset(0)
        assert not env.success()
        results = [env.step(HOLD).success for _ in range(15)]
    assert not any(results)


def _teleport(env: PiperSimEnv, name: str, xyz) -> None:
    body = env.model.body(name)
    adr = env.model.jnt_qposadr[body.jntadr[0]]
    env.data.qpos[adr:adr + 3] = xyz
    env.data.qpos[adr + 3:adr + 7] = (1, 0, 0, 0)
    env.data.qvel[env.model.jnt_dofadr[body.jntadr[0]]:][:6] = 0


def test_predicate_needs_the_object_really_on_the_plate():
    with PiperSimEnv(get_task("piper_goal", "red_block_on_plate"), NO_RENDER) as env:
        env.reset(0)
        plate = env.body_pos("plate")
        _teleport(env, "red_block", plate + [0, 0, 0.03])  # dropped from 1 cm onto the plate
        results = [env.step(HOLD).success for _ in range(4)]
        assert results[-1]
        _teleport(env, "red_block", plate + [0, 0, 0.12])  # hovering above it: falling
        assert not env.step(HOLD).success or env.body_pos("red_block")[2] < 0.05
        _teleport(env, "red_block", plate + [0.12, 0, 0.021])  # beside the plate
        assert not any(env.step(HOLD).success for _ in range(3))


def test_predicate_basket_and_stack():
    with PiperSimEnv(get_task("piper_goal", "red_block_in_basket"), NO_RENDER) as env:
        env.reset(0)
        _teleport(env, "red_block", env.body_pos("basket") + [0, 0, 0.03])
        assert [env.step(HOLD).success for _ in range(4)][-1]
    with PiperSimEnv(get_task("piper_goal", "stack_blue_on_red"), NO_RENDER) as env:
        env.reset(0)
        _teleport(env, "blue_block", env.body_pos("red_block") + [0, 0, 0.045])
        assert [env.step(HOLD).success for _ in range(4)][-1]
        # Blue beside red on the table is not stacked.
        _teleport(env, "blue_block", env.body_pos("red_block") + [0.0, 0.06, 0.0])
        assert not any(env.step(HOLD).success for _ in range(3))


@pytest.mark.parametrize("suite,task", ALL_TASKS)
def test_scripted_expert_succeeds(suite, task):
    spec = get_task(suite, task)
    with PiperSimEnv(spec, NO_RENDER) as env:
        expert = ScriptedExpert(env)
        for seed in (11, 12):
            env.reset(seed)
            expert.reset(seed)
            success, unreached_m = False, 0.0
            for _ in range(spec.max_steps):
                before, _ = env.commanded_pose
                action = expert.act()
                success = env.step(action).success
                # Clean demonstrations: every commanded move is executed as asked (no
                # pushing against joint limits or the workspace box).
                after, _ = env.commanded_pose
                unreached_m = max(unreached_m, float(np.linalg.norm(after - before - action[:3])))
                if success:
                    break
            assert success, f"{suite}/{task} seed {seed}"
            assert unreached_m < 0.002, f"{suite}/{task} seed {seed}: {unreached_m}"


def test_expert_actions_have_demonstration_profile():
    spec = get_task("piper_goal", "red_block_on_plate")
    with PiperSimEnv(spec, NO_RENDER) as env:
        expert = ScriptedExpert(env)
        runs = []
        for seed in (0, 1):
            env.reset(seed)
            expert.reset(seed)
            actions = []
            for _ in range(spec.max_steps):
                actions.append(expert.act())
                if env.step(actions[-1]).success:
                    break
            runs.append(np.array(actions))
    speeds = np.linalg.norm(runs[0][:, :3], axis=1)
    closed = runs[0][:, 6] >= 0.5
    first_close = int(np.argmax(closed))
    # Fast transits (up to ~2 cm per step), slow final approach just before the grasp.
    approach = speeds[first_close - 5:first_close].max()
    assert speeds.max() > 0.015 and approach < 0.008
    assert speeds[:first_close].max() > 1.5 * approach
    # Within the per-step clamp, and the two demonstrations differ.
    assert np.abs(runs[0][:, :3]).max() < 0.05 and np.abs(runs[0][:, 3:6]).max() < 0.35
    assert len(runs[0]) != len(runs[1]) or not np.allclose(runs[0], runs[1])


def test_expert_never_stands_still():
    """A memoryless policy copies a still label forever, so no label of the expert is still.

    Every move starts at a speed (minimum jerk with a head start); the gripper command changes
    while the tool is still arriving, and the lift or retreat follows at once (the fingers
    close or open within one control step, so the expert does not wait for them).
    """
    spec = get_task("piper_goal", "red_block_on_plate")
    with PiperSimEnv(spec, NO_RENDER) as env:
        expert = ScriptedExpert(env)
        env.reset(4)
        expert.reset(4)
        actions, widths = [], []
        for _ in range(spec.max_steps):
            actions.append(expert.act())
            result = env.step(actions[-1])
            widths.append(env.robot_state().gripper_width_m)
            if result.success:
                break
    assert result.success
    actions, widths = np.array(actions), np.array(widths)
    speed_m = np.linalg.norm(actions[:, :3], axis=1)
    gripper = actions[:, 6]
    changes = np.flatnonzero(np.diff(gripper) != 0) + 1
    assert len(changes) >= 2
    for change in changes:
        # The command changes while the tool still moves, and the fingers have finished
        # by the end of that step: there is nothing to wait for.
        assert speed_m[change] > 1e-4, change
        settled = widths[change:change + 2]
        assert np.ptp(settled) < 1e-3, change
        # With the fingers closed (or open) the next label already lifts (or retreats):
        # no state with the new gripper state still descends.
        if change + 1 < len(actions):
            assert actions[change + 1, 2] > 0.002, change
    assert speed_m[0] > 0.002                 # the first step already moves (head start)
    # The last label ends the approach that releases the object (success follows it).
    assert np.all(speed_m[:-1] > 5e-4), np.flatnonzero(speed_m[:-1] < 5e-4)


def test_min_jerk_head_start_starts_moving_and_stops_smoothly():
    from heisd_ros.sim.trajectories import min_jerk, min_jerk_peak_factor

    for head in (0.0, 0.2, 0.4):
        s = min_jerk(400, head)
        speed = np.diff(np.r_[0.0, s])
        assert s[-1] == pytest.approx(1.0) and np.all(speed > 0)
        assert speed.max() / speed.mean() == pytest.approx(min_jerk_peak_factor(head), rel=1e-3)
        assert speed[-1] < 1e-3 * speed.max() + 1e-9
    start = np.diff(np.r_[0.0, min_jerk(400, 0.2)])
    assert 0.35 < start[0] / start.max() < 0.5
    assert min_jerk_peak_factor(0.0) == pytest.approx(1.875)
    with pytest.raises(ValueError, match="head_start"):
        min_jerk(10, 0.5)


def test_expert_config_validates():
    with pytest.raises(ValueError, match="transit_speed_mps"):
        ExpertConfig(transit_speed_mps=0.0)
    with pytest.raises(ValueError, match="transit_head_start"):
        ExpertConfig(transit_head_start=0.6)
    with pytest.raises(ValueError, match="gripper_lead_steps"):
        ExpertConfig(gripper_lead_steps=-1)
    with pytest.raises(ValueError, match="grasp_wait_steps"):
        ExpertConfig(grasp_wait_steps=-1)
