"""The ``piper_dynamic`` suite: a conveyor moves things with world time, not with commands.

Real MuJoCo, no rendering. The belt's motion is checked in all three timings a task runs in:
bare physics (``advance``), lockstep control steps, and the real-time runner, where the
world keeps moving while a (fake-clock) policy decides.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from heisd_ros.models.small_vla_config import SmallVLAConfig
from heisd_ros.sim.config import SimConfig
from heisd_ros.sim.conveyor import ConveyorSpec
from heisd_ros.sim.env import PiperSimEnv
from heisd_ros.sim.expert import ScriptedExpert
from heisd_ros.sim.runner import RealTime, run_episodes
from heisd_ros.sim.suites import get_task, list_suites, list_tasks
from heisd_ros.sim.tasks import Goal, TaskSpec

FAST = SimConfig(render=False)
SUITE = "piper_dynamic"
HOLD = np.zeros(7)
#: The body that moves on its own in each task (the plate rides the belt in the last one).
MOVING = {"conveyor_block_on_plate": "red_block", "conveyor_blue_block_in_basket": "blue_block",
          "block_on_moving_plate": "plate"}
#: Everything on the table that must stand still, as a contrast.
STILL = {"conveyor_block_on_plate": ("plate",), "conveyor_blue_block_in_basket": ("basket",),
         "block_on_moving_plate": ("red_block",)}


def test_the_suite_is_registered_with_its_tasks():
    assert SUITE in list_suites()
    assert set(list_tasks(SUITE)) == set(MOVING)
    specs = [get_task(SUITE, t) for t in list_tasks(SUITE)]
    assert all(s.suite == SUITE and s.conveyor is not None and s.max_steps > 0 for s in specs)
    assert len({s.instruction for s in specs}) == len(specs)
    # The small VLA cuts instructions at this many bytes: every word must reach it.
    limit = SmallVLAConfig().max_instruction_bytes
    assert all(len(s.instruction.encode()) <= limit for s in specs)


@pytest.mark.parametrize("task", sorted(MOVING))
def test_the_world_moves_with_physics_time_and_no_command(task):
    with PiperSimEnv(get_task(SUITE, task), FAST) as env:
        env.reset(5)
        speed = env.conveyor_speed_m_per_s
        assert 0.02 <= abs(speed) <= 0.04
        moving, still = env.body_pos(MOVING[task]), {n: env.body_pos(n) for n in STILL[task]}
        t0 = env.data.time
        env.advance(round(1.0 / FAST.physics_timestep_s))     # 1 s of world time, no command
        elapsed_s = env.data.time - t0
        assert elapsed_s == pytest.approx(1.0)
        moved = env.body_pos(MOVING[task]) - moving
        np.testing.assert_allclose(moved, [0.0, speed * elapsed_s, 0.0], atol=5e-4)
        for name, before in still.items():
            np.testing.assert_allclose(env.body_pos(name), before, atol=5e-4, err_msg=name)


def test_a_static_suite_stands_still_in_the_same_check():
    spec = get_task("piper_goal", "red_block_on_plate")
    with PiperSimEnv(spec, FAST) as env:
        env.reset(5)
        names = [o.name for o in spec.objects] + [f.name for f in spec.fixtures]
        before = {n: env.body_pos(n) for n in names}
        env.advance(round(1.0 / FAST.physics_timestep_s))
        assert env.conveyor_speed_m_per_s == 0.0
        for name in names:
            np.testing.assert_allclose(env.body_pos(name), before[name], atol=5e-4, err_msg=name)


def test_each_lockstep_period_moves_the_block_by_speed_times_period():
    with PiperSimEnv(get_task(SUITE, "conveyor_block_on_plate"), FAST) as env:
        env.reset(2)
        period_s = 1.0 / FAST.control_rate_hz
        ys = [env.body_pos("red_block")[1]]
        for _ in range(5):
            env.step(HOLD)
            ys.append(env.body_pos("red_block")[1])
        np.testing.assert_allclose(np.diff(ys), env.conveyor_speed_m_per_s * period_s, atol=2e-4)


def test_speed_and_start_are_seeded_and_vary():
    with PiperSimEnv(get_task(SUITE, "conveyor_block_on_plate"), FAST) as env:
        runs = []
        for seed in (3, 3, 4):
            env.reset(seed)
            runs.append((env.conveyor_speed_m_per_s, *env.body_pos("red_block")[:2]))
    assert runs[0] == runs[1] and runs[0] != runs[2]


class FakeClock:
    """A wall clock that only moves when the test policy says so."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def test_in_real_time_the_world_moves_while_the_policy_decides():
    """A policy that takes 0.5 s per decision sees the block 0.5 s x speed further each time."""
    clock, seen = FakeClock(), []

    def slow_policy(observation):
        seen.append((observation.stamp_s, env.body_pos("red_block")[1]))
        clock.now_s += 0.5
        return HOLD

    spec = get_task(SUITE, "conveyor_block_on_plate")
    with PiperSimEnv(spec, FAST) as env:
        run_episodes(slow_policy, SUITE, spec.name, 1, 0, 20, env=env,
                     realtime=RealTime(clock=clock))
        speed = env.conveyor_speed_m_per_s
    stamps, ys = np.array(seen).T
    assert len(seen) >= 3
    np.testing.assert_allclose(np.diff(stamps), 0.5, atol=0.04)  # the next camera frame
    np.testing.assert_allclose(np.diff(ys), speed * np.diff(stamps), atol=5e-4)


@pytest.mark.parametrize("task", sorted(MOVING))
def test_the_expert_intercepts_in_lockstep(task):
    spec = get_task(SUITE, task)
    with PiperSimEnv(spec, FAST) as env:
        expert = ScriptedExpert(env)
        for seed in (0, 1):
            env.reset(seed)
            expert.reset(seed)
            start = env.body_pos(MOVING[task])
            success = any(env.step(expert.act()).success for _ in range(spec.max_steps))
            assert success, f"{task} seed {seed}"
            # It really met a moving target: the belt carried it a good way meanwhile.
            if MOVING[task] == spec.goals[0].target:
                assert abs(env.body_pos(MOVING[task])[1] - start[1]) > 0.1


def test_resting_on_a_moving_plate_counts_whatever_the_belt_speed():
    """"Placed" means still relative to the target: a plate riding at 8 cm/s carries it."""
    spec = get_task(SUITE, "block_on_moving_plate")
    fast_belt = replace(spec.conveyor, speed_range_m_per_s=(0.08, 0.08))
    with PiperSimEnv(replace(spec, conveyor=fast_belt), FAST) as env:
        env.reset(0)
        block = env.model.body("red_block")
        adr, dof = env.model.jnt_qposadr[block.jntadr[0]], env.model.jnt_dofadr[block.jntadr[0]]
        env.data.qpos[adr:adr + 7] = (*(env.body_pos("plate") + [0, 0, 0.03]), 1, 0, 0, 0)
        env.data.qvel[dof:dof + 6] = (0, 0.08, 0, 0, 0, 0)
        results = [env.step(HOLD).success for _ in range(4)]
        assert results[-1]
        assert env.body_velocity_mps("red_block")[1] == pytest.approx(0.08, abs=0.005)


def test_conveyor_and_task_specs_validate():
    with pytest.raises(ValueError, match="speed_range_m_per_s"):
        ConveyorSpec(speed_range_m_per_s=(-0.02, 0.02))
    with pytest.raises(ValueError, match="mounted"):
        ConveyorSpec(mounted=("plate", "basket"))
    spec = get_task(SUITE, "conveyor_block_on_plate")
    with pytest.raises(ValueError, match="conveyor: mounted 'tray'"):
        TaskSpec(name="x", suite=SUITE, instruction="x", objects=spec.objects,
                 fixtures=spec.fixtures, layout=spec.layout,
                 goals=(Goal("red_block", "on", "plate"),),
                 conveyor=ConveyorSpec(mounted=("tray",)))
