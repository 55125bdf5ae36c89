"""RobotController end to end.

EE commands -> safety -> gripper -> PiperRobot -> piper_sdk -> virtual CAN -> emulated arm.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from heisd_ros.robot import piper_can as pc
from heisd_ros.robot.base import EECommand, GripperState, RobotFault
from heisd_ros.robot.controller import ControllerConfig, ControllerStatus, RobotController
from heisd_ros.robot.dry_run import emulated_piper_robot
from heisd_ros.robot.emulated_piper import EmulatedPiper, EmulatedPiperConfig
from heisd_ros.robot.gripper import DoneReason, GripperConfig, GripperPhase, GripperStateMachine
from heisd_ros.robot.safety import SafetyConfig, SafetyFilter
from test.polling import allclose, wait_until

# piper_sdk 0.6.2 still passes python-can's deprecated `bustype`.
pytestmark = pytest.mark.filterwarnings(
    "ignore:The 'bustype' argument is deprecated:DeprecationWarning"
)

JOINTS = (0.0, 1.1, -1.2, 0.0, 0.5, 0.0)  # flange at about (0.23, 0, 0.37) m
OPEN, CLOSED = GripperState.OPEN, GripperState.CLOSED


@contextmanager
def controller_on_emulated_arm(
    enabled: bool = True,
    safety: SafetyConfig | None = None,
    gripper: GripperConfig | None = None,
    controller: ControllerConfig | None = None,
    **emulator_kwargs,
) -> Iterator[tuple[EmulatedPiper, RobotController]]:
    emulator = EmulatedPiperConfig(
        channel="replaced",
        initial_joints_rad=JOINTS,
        initial_gripper_width_m=0.07,
        **emulator_kwargs,
    )
    with emulated_piper_robot(emulator, start_enabled=enabled) as (emu, robot):
        controller = RobotController(
            robot,
            SafetyFilter(safety or SafetyConfig(watchdog_timeout_s=5.0)),
            GripperStateMachine(gripper or GripperConfig()),
            controller,
        )
        controller.start(time.monotonic())
        yield emu, controller


class Steps:
    """Commands with increasing step indices."""

    def __init__(self) -> None:
        self.index = 0

    def __call__(
        self, dp=(0.0, 0.0, 0.0), dr=(0.0, 0.0, 0.0), gripper=OPEN, from_target=True
    ) -> EECommand:
        self.index += 1
        return EECommand(
            dp, dr, gripper=gripper, gripper_from_target=from_target, step_index=self.index
        )


def test_delta_commands_move_the_emulated_arm_by_the_delta():
    with controller_on_emulated_arm() as (emu, ctl):
        step = Steps()
        start = ctl.safety.reference.position_m  # the measured pose at start()
        assert allclose(start, emu.state().ee_position_m, atol=1e-6)
        for _ in range(3):
            result = ctl.step(step(dp=(0.01, 0.0, -0.005)), time.monotonic())
            assert result.status == ControllerStatus.RUNNING and result.sent is not None
        goal = start + [0.03, 0.0, -0.015]
        assert allclose(result.sent.position_m, goal, atol=1e-12)
        # 1e-6 m: the target travels in 0.001 mm units.
        assert wait_until(lambda: allclose(emu.state().ee_position_m, goal, atol=1e-6))


def test_oversized_and_nan_commands_are_limited_or_rejected():
    with controller_on_emulated_arm() as (emu, ctl):
        step = Steps()
        start = ctl.safety.reference.position_m
        big = ctl.step(step(dp=(0.5, 0.0, 0.0)), time.monotonic())
        assert "step_translation" in big.clamped
        assert np.linalg.norm(big.sent.position_m - start) == pytest.approx(0.02)
        bad = ctl.step(step(dp=(math.nan, 0.0, 0.0)), time.monotonic())
        assert bad.sent is None and bad.held and "non-finite" in bad.rejected_reason
        assert bad.status == ControllerStatus.RUNNING
        assert wait_until(
            lambda: allclose(emu.state().ee_position_m, big.sent.position_m, atol=1e-6)
        )


def test_arm_waits_while_the_gripper_closes_then_continues():
    # The closing must end by REACHED: a loaded machine that delays the emulator's feedback
    # past the default 0.3 s stall window (or 3 s timeout) must not end it early here (stalls
    # and timeouts have tests of their own).
    patient = GripperConfig(stall_window_s=1.0, timeout_s=10.0)
    with controller_on_emulated_arm(gripper=patient, gripper_speed_m_s=0.05) as (emu, ctl):
        step = Steps()
        first = ctl.step(step(dp=(0.0, 0.0, 0.01), gripper=CLOSED), time.monotonic())
        assert first.sent is not None and first.gripper == OPEN  # hysteresis: 1 of 2
        closing = ctl.step(step(dp=(0.0, 0.0, 0.01), gripper=CLOSED), time.monotonic())
        assert closing.status == ControllerStatus.GRIPPER_WAIT and closing.gripper == CLOSED
        assert closing.sent.gripper_width_m == 0.0 and "gripper" in closing.rejected_reason
        parked = first.sent.position_m
        assert allclose(closing.sent.position_m, parked)  # the arm part of the trigger is dropped

        waiting = ctl.step(step(dp=(0.01, 0.0, 0.0), gripper=CLOSED), time.monotonic())
        assert (
            waiting.sent is None
            and waiting.held
            and waiting.status == ControllerStatus.GRIPPER_WAIT
        )
        assert emu.state().gripper_width_m > 0.01  # still closing (1.4 s from 70 mm)
        assert wait_until(lambda: ctl.tick(time.monotonic()).status == ControllerStatus.RUNNING)
        # Done within the settle tolerance of the width it read (CAN reports whole micrometres).
        settle_m = ctl.gripper.config.settle_tolerance_m
        assert ctl.gripper.last_done_reason == DoneReason.REACHED
        assert emu.state().gripper_width_m <= settle_m + 1e-6
        assert allclose(emu.state().ee_position_m, parked, atol=1e-6)  # did not move meanwhile

        moved = ctl.step(step(dp=(0.01, 0.0, 0.0), gripper=CLOSED), time.monotonic())
        assert moved.status == ControllerStatus.RUNNING
        assert allclose(moved.sent.position_m, parked + [0.01, 0.0, 0.0])


def test_gripper_stalled_on_an_object_releases_the_arm():
    with controller_on_emulated_arm(gripper=GripperConfig(hysteresis_steps=1)) as (emu, ctl):
        emu.place_object(0.03)
        step = Steps()
        assert (
            ctl.step(step(gripper=CLOSED), time.monotonic()).status == ControllerStatus.GRIPPER_WAIT
        )
        assert wait_until(lambda: ctl.tick(time.monotonic()).status == ControllerStatus.RUNNING)
        assert ctl.gripper.last_done_reason == DoneReason.STALLED
        assert emu.state().gripper_width_m == pytest.approx(0.03)
        assert emu.state().gripper_effort_nm == pytest.approx(1.0)


def test_gripper_timeout_releases_the_arm():
    slow = {"gripper_speed_m_s": 0.01}  # 7 s for a full close
    with controller_on_emulated_arm(
        gripper=GripperConfig(hysteresis_steps=1, timeout_s=0.6), **slow
    ) as (emu, ctl):
        step = Steps()
        assert (
            ctl.step(step(gripper=CLOSED), time.monotonic()).status == ControllerStatus.GRIPPER_WAIT
        )
        assert wait_until(lambda: ctl.tick(time.monotonic()).gripper_phase == GripperPhase.IDLE)
        assert ctl.gripper.last_done_reason == DoneReason.TIMEOUT
        resumed = ctl.step(step(dp=(0.0, 0.01, 0.0), gripper=CLOSED), time.monotonic())
        assert resumed.status == ControllerStatus.RUNNING and resumed.sent is not None


def test_non_target_gripper_tokens_never_move_the_gripper():
    with controller_on_emulated_arm(gripper=GripperConfig(hysteresis_steps=1)) as (emu, ctl):
        step = Steps()
        for _ in range(4):
            result = ctl.step(
                step(dp=(0.0, 0.0, 0.002), gripper=CLOSED, from_target=False), time.monotonic()
            )
            assert result.status == ControllerStatus.RUNNING and result.sent.gripper_width_m is None
        assert emu.state().frames_received.get(pc.GRIPPER_CTRL, 0) == 0
        assert emu.state().gripper_width_m == pytest.approx(0.07)


def test_watchdog_holds_then_resumes():
    with controller_on_emulated_arm(safety=SafetyConfig(watchdog_timeout_s=0.3)) as (emu, ctl):
        t0 = time.monotonic()
        step = Steps()
        ctl.step(step(dp=(0.0, 0.0, 0.01)), t0)
        assert ctl.tick(t0 + 0.1).status == ControllerStatus.RUNNING
        held = ctl.tick(t0 + 0.5)
        assert held.status == ControllerStatus.WATCHDOG_HOLD and held.held
        sent_before = emu.state().frames_received.get(pc.END_POSE_CTRL[2], 0)
        ctl.tick(t0 + 0.6)
        assert wait_until(
            lambda: emu.state().frames_received.get(pc.END_POSE_CTRL[2], 0) > sent_before
        )
        assert ctl.step(step(dp=(0.0, 0.0, 0.01)), t0 + 0.7).status == ControllerStatus.RUNNING


def test_lost_can_puts_the_controller_in_hold_without_crashing():
    # A short watchdog makes every tick re-send the hold target while the bus is silent.
    with controller_on_emulated_arm(safety=SafetyConfig(watchdog_timeout_s=0.1)) as (emu, ctl):
        step = Steps()
        ctl.step(step(dp=(0.0, 0.0, 0.01)), time.monotonic())
        emu.set_can_link(False)
        lost_at = time.monotonic()
        # The driver keeps ticking (and holding) at 50 Hz; its own frames must not mask the loss.
        results = []

        def ticked_into_fault() -> bool:
            results.append(ctl.tick(time.monotonic()))
            return results[-1].status == ControllerStatus.FAULT

        assert wait_until(ticked_into_fault, timeout_s=3.0)
        fault = results[-1]
        elapsed = time.monotonic() - lost_at
        print(f"controller FAULT {elapsed:.2f} s after the CAN went silent: {fault.detail}")
        assert any(r.status == ControllerStatus.WATCHDOG_HOLD and r.held for r in results)
        assert fault.held and fault.faults & {RobotFault.CAN_LOST, RobotFault.STALE_FEEDBACK}
        rejected = ctl.step(step(dp=(0.0, 0.0, 0.01)), time.monotonic())
        assert (
            rejected.status == ControllerStatus.FAULT
            and rejected.sent is None
            and rejected.rejected_reason
        )

        emu.set_can_link(True)
        assert wait_until(lambda: ctl.robot.observe().ok)
        assert ctl.tick(time.monotonic()).status == ControllerStatus.FAULT  # latched
        assert ctl.clear_fault(time.monotonic()).status == ControllerStatus.RUNNING
        assert ctl.step(step(dp=(0.0, 0.0, 0.01)), time.monotonic()).sent is not None


def test_injected_collision_faults_the_controller():
    with controller_on_emulated_arm() as (emu, ctl):
        emu.inject_collision(2)
        assert wait_until(lambda: ctl.tick(time.monotonic()).status == ControllerStatus.FAULT)
        assert RobotFault.COLLISION in ctl.tick(time.monotonic()).faults
        assert ctl.clear_fault(time.monotonic()).status == ControllerStatus.FAULT  # still colliding
        emu.clear_faults()
        assert wait_until(
            lambda: ctl.clear_fault(time.monotonic()).status == ControllerStatus.RUNNING
        )


def test_estop_latches_and_reaches_the_arm():
    with controller_on_emulated_arm() as (emu, ctl):
        step = Steps()
        assert ctl.estop().status == ControllerStatus.ESTOP
        assert wait_until(lambda: emu.state().frames_received.get(pc.MOTION_CTRL_1, 0) == 1)
        result = ctl.step(step(dp=(0.0, 0.0, 0.01)), time.monotonic())
        assert result.status == ControllerStatus.ESTOP and result.sent is None


def test_disabled_arm_executes_nothing_until_enabled():
    with controller_on_emulated_arm(enabled=False) as (emu, ctl):
        step = Steps()
        assert ctl.status == ControllerStatus.DISABLED
        result = ctl.step(step(dp=(0.0, 0.0, 0.01)), time.monotonic())
        assert result.status == ControllerStatus.DISABLED and result.sent is None
        ctl.robot.enable(timeout_s=3.0)
        assert (
            ctl.step(step(dp=(0.0, 0.0, 0.01)), time.monotonic()).status == ControllerStatus.RUNNING
        )


def test_tracking_error_faults_when_commands_outrun_the_arm():
    slow_arm = {"max_linear_speed_m_s": 0.002}
    with controller_on_emulated_arm(
        controller=ControllerConfig(max_tracking_error_m=0.03), **slow_arm
    ) as (emu, ctl):
        step = Steps()
        # The reference runs 2 cm ahead per step; the arm crawls at 2 mm/s.
        assert (
            ctl.step(step(dp=(0.0, 0.0, 0.02)), time.monotonic()).status == ControllerStatus.RUNNING
        )
        assert (
            ctl.step(step(dp=(0.0, 0.0, 0.02)), time.monotonic()).status == ControllerStatus.RUNNING
        )
        result = ctl.step(step(dp=(0.0, 0.0, 0.02)), time.monotonic())
        assert result.sent is None and result.rejected_reason
        assert (
            result.status == ControllerStatus.FAULT
            and "tracking error" in result.detail
            and result.held
        )
        assert not result.faults  # the robot itself reports nothing wrong
        # The arm is told to stay where it is, not to keep pushing toward the runaway target.
        here = result.state.ee_position_m
        target = lambda: emu.state().ee_target_m  # noqa: E731
        assert wait_until(lambda: target() is not None and allclose(target(), here, atol=1e-6))
        assert allclose(ctl.robot.last_target.position_m, result.state.ee_position_m)


def test_start_outside_the_box_fails_fast():
    box = SafetyConfig(workspace_min_m=(0.3, -0.1, 0.1), workspace_max_m=(0.5, 0.1, 0.5))
    with pytest.raises(ValueError, match="outside the workspace box"):
        with controller_on_emulated_arm(safety=box):
            pass


def test_step_before_start_is_a_programming_error():
    with emulated_piper_robot(
        EmulatedPiperConfig(channel="replaced", initial_joints_rad=JOINTS)
    ) as (_, robot):
        ctl = RobotController(robot, SafetyFilter(), GripperStateMachine())
        assert ctl.tick(0.0).status == ControllerStatus.NOT_STARTED
        with pytest.raises(RuntimeError, match="start"):
            ctl.step(Steps()(), 0.0)


def test_stale_future_and_unstamped_commands_are_refused_before_anything_moves():
    config = ControllerConfig(max_command_age_s=0.5, max_command_future_s=0.1)
    with controller_on_emulated_arm(controller=config) as (emu, ctl):
        step, wall = Steps(), 1_000.0
        start = ctl.safety.target.position_m
        for stamp, words in (
            (wall - 0.6, "stale command"),
            (wall + 0.2, "in the future"),
            (0.0, "no stamp"),
        ):
            command = dataclasses.replace(step(dp=(0.01, 0.0, 0.0), gripper=CLOSED), stamp_s=stamp)
            result = ctl.step(command, time.monotonic(), clock_s=wall)
            assert result.held and result.sent is None and words in result.rejected_reason
        assert ctl.gripper.state == OPEN  # the gripper never saw them either
        fresh = dataclasses.replace(step(dp=(0.01, 0.0, 0.0)), stamp_s=wall - 0.45)
        result = ctl.step(fresh, time.monotonic(), clock_s=wall)
        assert allclose(result.sent.position_m, start + [0.01, 0.0, 0.0], atol=1e-12)
        with pytest.raises(RuntimeError, match="clock_s"):
            ctl.step(step(), time.monotonic())


def test_lost_commands_re_anchor_the_target_where_the_arm_is():
    slow_arm = {"max_linear_speed_m_s": 0.02}  # 1 cm/s at the driver's 50 %: it lags
    with controller_on_emulated_arm(**slow_arm) as (emu, ctl):
        step = Steps()
        start = ctl.safety.target.position_m
        ctl.step(step(dp=(0.0, 0.0, -0.02)), time.monotonic())
        assert wait_until(lambda: emu.state().ee_position_m[2] < start[2] - 0.002)  # on its way
        step.index += 2  # two commands lost
        gap = ctl.step(step(dp=(0.0, 0.0, -0.02)), time.monotonic())
        assert gap.sent is None and gap.lost == 2 and gap.reanchored
        here = gap.state.ee_position_m
        assert here[2] > start[2] - 0.02  # mid-way: the arm was still moving
        assert allclose(ctl.safety.reference.position_m, here, atol=1e-12)
        # The arm is told to stay where it is (its last target is the measured pose).
        assert wait_until(lambda: allclose(emu.state().ee_target_m, here, atol=1e-6))
        resumed = ctl.step(step(dp=(0.01, 0.0, 0.0)), time.monotonic())
        assert allclose(resumed.sent.position_m, here + [0.01, 0.0, 0.0], atol=1e-12)


def test_ticks_release_speed_limited_motion_until_the_target_is_reached():
    limits = SafetyConfig(watchdog_timeout_s=5.0, max_linear_speed_m_s=0.1)
    with controller_on_emulated_arm(safety=limits) as (emu, ctl):
        step = Steps()
        start = ctl.safety.target.position_m
        goal = start + [0.0, 0.02, 0.0]
        t0 = time.monotonic()
        assert ctl.tick(t0).sent is None  # nothing to release; the tick marks the time
        first = ctl.step(step(dp=(0.0, 0.02, 0.0)), t0 + 0.05)
        assert allclose(first.sent.position_m, start + [0.0, 0.005, 0.0], atol=1e-12)  # 0.1 x 0.05
        sent = [ctl.tick(t0 + 0.05 + 0.02 * i).sent for i in range(1, 10)]
        released = [s.position_m[1] - start[1] for s in sent if s is not None]
        assert released == pytest.approx([0.007, 0.009, 0.011, 0.013, 0.015, 0.017, 0.019, 0.02])
        assert wait_until(lambda: allclose(emu.state().ee_position_m, goal, atol=1e-6))
