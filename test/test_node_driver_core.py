"""DriverCore without a node: retries, SDK errors, refusals and service answers on a fake robot.

The node-level behaviour (DDS, the emulated arm, diagnostics) is in ``test_node_driver*.py``;
here the decisions the node delegates are checked directly, with a scripted robot and clock.
"""

from __future__ import annotations

import math

import can
import numpy as np
import pytest

from test.ros_env import require_ros

require_ros()  # driver_core's message helpers import the ROS message packages

from heisd_ros.nodes.driver_core import DISABLE_WARNING, DriverCore  # noqa: E402
from heisd_ros.nodes.driver_report import DriverReport  # noqa: E402
from heisd_ros.robot.base import EECommand, EETarget, Robot, RobotError, RobotState  # noqa: E402
from heisd_ros.robot.controller import (  # noqa: E402
    ControllerConfig,
    ControllerStatus,
    RobotController,
)
from heisd_ros.robot.gripper import GripperConfig, GripperStateMachine  # noqa: E402
from heisd_ros.robot.safety import SafetyConfig, SafetyFilter  # noqa: E402


class FakeRobot(Robot):
    """A robot at rest at (0.25, 0, 0.3) m; connecting fails ``connect_errors`` times."""

    def __init__(self, connect_errors: int = 0) -> None:
        self.connect_errors, self.connect_calls = connect_errors, 0
        self.connected, self.enabled = False, True
        self.acts: list[EETarget] = []
        self.holds = 0
        self.act_error: Exception | None = None

    def connect(self) -> None:
        self.connect_calls += 1
        if self.connect_errors:
            self.connect_errors -= 1
            raise RobotError("no feedback from the PIPER on 'fake'")
        self.connected = True

    def disconnect(self) -> None:
        self.connected = False

    @property
    def is_connected(self) -> bool:
        return self.connected

    def observe(self) -> RobotState:
        return RobotState(
            stamp_s=1.0, joint_positions_rad=np.zeros(6), gripper_width_m=0.07,
            ee_position_m=np.array([0.25, 0.0, 0.3]), ee_rpy_rad=np.array([math.pi, 1.2, 0.0]),
            motors_enabled=(self.enabled,) * 6,
        )

    def act(self, target: EETarget) -> None:
        if self.act_error is not None:
            raise self.act_error
        self.acts.append(target)

    def hold(self) -> None:
        self.holds += 1

    def enable(self, timeout_s: float | None = None) -> None:
        self.enabled = True

    def disable(self) -> None:
        self.enabled = False

    def estop(self) -> None:
        pass


class Log:
    """Records (level, message) like rclpy's logger; accepts its keywords."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def info(self, message: str, **_kwargs) -> None:
        self.lines.append(("info", message))

    def warning(self, message: str, **_kwargs) -> None:
        self.lines.append(("warning", message))

    def error(self, message: str, **_kwargs) -> None:
        self.lines.append(("error", message))


@pytest.fixture
def rig():
    robot, log, clock = FakeRobot(), Log(), [0.0]
    controller = RobotController(
        robot, SafetyFilter(SafetyConfig()), GripperStateMachine(GripperConfig()),
        ControllerConfig(max_tracking_error_m=None),
    )
    core = DriverCore(controller, DriverReport(), log, can_channel="fake", interface="virtual",
                      reconnect_period_s=2.0, clock=lambda: clock[0])
    return core, robot, log, clock


def command(step: int, dx: float = 0.01) -> EECommand:
    return EECommand((dx, 0.0, 0.0), (0.0, 0.0, 0.0), step_index=step, frame_id="base_link")


def test_a_silent_arm_is_retried_every_period_and_logged_once(rig):
    core, robot, log, clock = rig
    robot.connect_errors = 2
    assert not core.started(0.0)
    assert core.report.connect_error.startswith("CAN: cannot connect to the PIPER: no feedback")
    assert not core.started(1.0) and robot.connect_calls == 1  # not before reconnect_period_s
    assert not core.started(2.0) and robot.connect_calls == 2
    assert sum("retrying every 2 s" in m for _, m in log.lines) == 1
    core.command(command(1))
    assert core.report.last_outcome == ("step 1: rejected",
                                        f"driver not ready: {core.report.connect_error}")
    assert core.started(4.0) and core.report.connect_error == ""
    assert core.controller.status == ControllerStatus.RUNNING


def test_an_sdk_error_in_a_step_holds_is_reported_and_cleared_with_the_fault(rig):
    core, robot, log, clock = rig
    assert core.started(0.0)
    core.command(command(1))
    assert len(robot.acts) == 1 and core.report.counts["executed"] == 1
    robot.act_error = can.CanError("bus off")
    clock[0] = 1.0
    core.command(command(2))
    assert robot.holds == 1  # the answer to an SDK error is a hold, never a disable
    assert core.report.sdk_error == "step: CanError: bus off"
    assert core.report.last_outcome == ("step 2: rejected", "SDK error: step: CanError: bus off")
    assert core.report.sdk_error_recent(5.9) and not core.report.sdk_error_recent(6.1)
    robot.act_error = None
    assert core.clear_fault_service() == (True, "fault cleared; controller running")
    assert core.report.sdk_error == "" and not core.report.sdk_error_recent(1.0)


def test_clamps_are_counted_and_named(rig):
    core, _, log, _ = rig
    assert core.started(0.0)
    core.command(command(7, dx=0.5))
    assert core.report.counts["clamped"] == 1
    assert core.report.last_clamped == "step 7: step_translation"
    assert ("info", "EECommand clamped: step 7: step_translation") in log.lines


def test_service_answers(rig):
    core, robot, log, _ = rig
    assert core.disable_service() == (False, "not connected to the PIPER yet")
    assert core.started(0.0)
    ok, message = core.disable_service()
    assert ok and DISABLE_WARNING in message and not robot.enabled
    ok, message = core.enable_service()
    assert (ok, message) == (True, "motors enabled; controller running") and robot.enabled
    ok, message = core.estop_service()
    assert ok and core.controller.status == ControllerStatus.ESTOP
    core.command(command(3))
    assert core.report.last_outcome[1] == "not executed: controller is estop"


def test_an_unconfigured_driver_refuses_everything_with_the_reason():
    report = DriverReport(config_error="piper driver not configured: bad")
    core = DriverCore(None, report, Log())
    assert not core.started(0.0)
    for answer in (core.enable_service, core.disable_service, core.estop_service,
                   core.clear_fault_service):
        assert answer() == (False, "piper driver not configured: bad")
    core.command(command(1))
    assert report.last_outcome[1] == "driver not ready: piper driver not configured: bad"
