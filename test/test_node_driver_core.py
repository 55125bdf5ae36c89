"""DriverCore without a node: retries, SDK errors, refusals and service answers on a fake robot.

The node-level behaviour (DDS, the emulated arm, diagnostics) is in ``test_node_driver*.py``;
here the decisions the node delegates are checked directly, with a scripted robot and clock.
"""

from __future__ import annotations

import logging
import math

import can
import numpy as np
import pytest

from test.ros_env import require_ros

require_ros()  # driver_core's message helpers import the ROS message packages

from heisd_ros.nodes.driver_core import DISABLE_WARNING, DriverCore  # noqa: E402
from heisd_ros.nodes.driver_link import Backoff  # noqa: E402
from heisd_ros.nodes.driver_report import DriverReport  # noqa: E402
from heisd_ros.robot.base import (  # noqa: E402
    EECommand,
    EETarget,
    Robot,
    RobotError,
    RobotFault,
    RobotState,
)
from heisd_ros.robot.controller import (  # noqa: E402
    ControllerConfig,
    ControllerStatus,
    RobotController,
)
from heisd_ros.robot.gripper import GripperConfig, GripperStateMachine  # noqa: E402
from heisd_ros.robot.piper_sdk_log import SDK_LOGGER, capture_sdk_log  # noqa: E402
from heisd_ros.robot.safety import SafetyConfig, SafetyFilter  # noqa: E402

WALL = 1_000_000.0  # now on the stamp clock (the node's ROS clock) in these tests, s


class FakeRobot(Robot):
    """A robot at rest at (0.25, 0, 0.3) m; connecting fails ``connect_errors`` times."""

    def __init__(self, connect_errors: int = 0) -> None:
        self.connect_errors, self.connect_calls = connect_errors, 0
        self.connected, self.enabled = False, True
        self.acts: list[EETarget] = []
        self.holds = 0
        self.act_error: Exception | None = None
        self.faults: frozenset[RobotFault] = frozenset()
        self.reopen_calls: list[float] = []
        self.reopen_error: Exception | None = None
        self.clock = [0.0]

    def reopen(self) -> None:
        self.reopen_calls.append(self.clock[0])
        if self.reopen_error is not None:
            raise self.reopen_error

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
            motors_enabled=(self.enabled,) * 6, faults=self.faults,
            detail="no CAN feedback on 'fake'" if self.faults else "",
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
    robot, log = FakeRobot(), Log()
    clock = robot.clock
    controller = RobotController(
        robot, SafetyFilter(SafetyConfig()), GripperStateMachine(GripperConfig()),
        ControllerConfig(max_tracking_error_m=None, max_command_age_s=0.5),
    )
    core = DriverCore(controller, DriverReport(), log, can_channel="fake", interface="virtual",
                      reconnect_period_s=2.0, reconnect_max_period_s=8.0,
                      clock=lambda: clock[0], stamp_clock=lambda: WALL)
    return core, robot, log, clock


def command(step: int, dx: float = 0.01, age_s: float = 0.1, **kwargs) -> EECommand:
    """A delta decided on an observation ``age_s`` old."""
    return EECommand((dx, 0.0, 0.0), (0.0, 0.0, 0.0), step_index=step, frame_id="base_link",
                     stamp_s=WALL - age_s, **kwargs)


def test_backoff_doubles_up_to_its_cap_and_restarts_after_success():
    backoff = Backoff(first_s=2.0, max_s=8.0)
    assert backoff.due(0.0)
    assert [backoff.failed(t) for t in (0.0, 2.0, 6.0, 14.0, 22.0)] == [2, 4, 8, 8, 8]
    assert not backoff.due(29.9) and backoff.due(30.0)
    backoff.reset()
    assert backoff.due(0.0) and backoff.failed(0.0) == 2.0


def test_a_silent_arm_is_retried_with_back_off_and_logged_once(rig):
    core, robot, log, clock = rig
    robot.connect_errors = 3
    assert not core.started(0.0)
    assert core.report.connect_error.startswith("CAN: cannot connect to the PIPER: no feedback")
    assert not core.started(1.0) and robot.connect_calls == 1  # not before reconnect_period_s
    assert not core.started(2.0) and robot.connect_calls == 2
    assert not core.started(5.9) and robot.connect_calls == 2  # then 4 s
    assert not core.started(6.0) and robot.connect_calls == 3
    assert sum("retrying in 2 s" in m for _, m in log.lines) == 1  # the same reason: once
    core.command(command(1))
    assert core.report.last_outcome == ("step 1: rejected",
                                        f"driver not ready: {core.report.connect_error}")
    assert not core.started(13.9) and robot.connect_calls == 3  # then 8 s (the cap)
    assert core.started(14.0) and core.report.connect_error == ""
    assert core.controller.status == ControllerStatus.RUNNING
    assert core.report.counts["connect_attempts"] == 4


def test_commands_are_refused_when_stale_unstamped_or_from_the_future(rig):
    core, robot, log, clock = rig
    assert core.started(0.0)
    core.command(command(1, age_s=0.4))
    assert core.report.counts["executed"] == 1 and len(robot.acts) == 1
    for step, age, words in ((2, 0.6, "stale command"), (3, -0.2, "in the future"),
                             (4, WALL, "no stamp")):  # age WALL: stamp 0
        core.command(command(step, age_s=age))
        outcome, reason = core.report.last_outcome
        assert outcome == f"step {step}: rejected" and words in reason, reason
    assert len(robot.acts) == 1 and robot.holds == 3  # refused: held, nothing new sent
    assert sum("not executed: stale command" in m for _, m in log.lines) == 1
    core.command(command(5, age_s=0.05))  # fresh again, and contiguous: runs
    assert core.report.counts["executed"] == 2 and core.report.counts["lost"] == 0


def test_lost_step_indices_are_counted_and_re_anchor_the_target(rig):
    core, robot, log, clock = rig
    assert core.started(0.0)
    core.command(command(1))
    core.command(command(4))  # 2 and 3 never arrived
    assert core.report.counts["lost"] == 2 and core.report.counts["reanchored"] == 1
    assert "2 command(s) lost" in core.report.last_outcome[1]
    assert np.allclose(robot.acts[-1].position_m, [0.25, 0.0, 0.3])  # back at the measured pose
    core.command(command(5))
    assert np.allclose(robot.acts[-1].position_m, [0.26, 0.0, 0.3])  # resumed from there


def test_enable_is_refused_while_the_arm_is_unreachable_or_the_controller_latched(rig):
    core, robot, log, clock = rig
    assert core.started(0.0)
    robot.faults = frozenset({RobotFault.CAN_LOST})
    ok, message = core.enable_service()
    assert not ok and "cannot be reached" in message and "CAN lost" in message, message
    core.tick()  # the controller latches FAULT
    assert core.controller.status == ControllerStatus.FAULT
    robot.faults = frozenset()  # the bus is back, the fault stays latched
    ok, message = core.enable_service()
    assert not ok and "controller is fault" in message and "~/clear_fault" in message, message
    assert core.clear_fault_service()[0]
    assert core.enable_service() == (True, "motors enabled; controller running")


def test_lost_feedback_reopens_the_port_at_once_then_with_back_off(rig):
    core, robot, log, clock = rig
    assert core.started(0.0)
    robot.faults = frozenset({RobotFault.CAN_LOST})
    robot.reopen_error = RobotError("cannot open CAN 'fake' (socketcan): no such device")
    for t in (0.0, 1.0, 2.0, 3.0, 5.9, 6.0, 13.9, 14.0, 21.9, 22.0):
        clock[0] = t
        core.tick()
    assert robot.reopen_calls == [0.0, 2.0, 6.0, 14.0, 22.0]  # 2, 4, 8, 8 (the cap)
    assert "no such device" in core.report.link_error
    assert core.report.counts["link_reopens"] == 5
    assert sum("cannot be reopened" in m for _, m in log.lines) == 1  # the same reason: once
    robot.reopen_error = None
    clock[0] = 30.0
    core.tick()  # reopened; the arm still silent
    assert robot.reopen_calls[-1] == 30.0 and "reopened" in core.report.link_error
    robot.faults = frozenset()
    clock[0] = 31.0
    core.tick()  # feedback is back: no more reopening, the back-off starts over
    assert core.report.link_error == "" and ("info", "CAN feedback is back on 'fake'") in log.lines
    assert core.controller.status == ControllerStatus.FAULT  # latched until ~/clear_fault
    robot.faults = frozenset({RobotFault.CAN_LOST})
    clock[0] = 31.5
    core.tick()
    assert robot.reopen_calls[-1] == 31.5


def test_sdk_log_lines_are_captured_counted_and_summarised():
    capture = capture_sdk_log()
    log, robot = Log(), FakeRobot()
    controller = RobotController(robot, SafetyFilter(), GripperStateMachine())
    clock = [0.0]
    core = DriverCore(controller, DriverReport(), log, clock=lambda: clock[0], sdk_log=capture)
    sdk = logging.LoggerAdapter(logging.getLogger(SDK_LOGGER), {})  # as piper_sdk logs
    before = capture.total
    for _ in range(200):
        sdk.error("EndPoseXY send failed: SendCanMessage(%s)", "SEND_MESSAGE_FAILED (100016)")
    core.tick()
    assert core.report.sdk_log_lines == before + 200
    assert core.report.sdk_log_last == (
        "EndPoseXY send failed: SendCanMessage(SEND_MESSAGE_FAILED (100016))")
    sdk.error("CAN socket can9 does not exist.")
    clock[0] = 5.0
    core.tick()  # a second summary only after SDK_LOG_REPORT_S
    clock[0] = 10.0
    core.tick()
    summaries = [m for level, m in log.lines if "piper_sdk logged" in m]
    assert len(summaries) == 2, summaries
    assert "200 line(s)" in summaries[0] and "1 line(s)" in summaries[1]
    assert not [h for h in logging.getLogger(SDK_LOGGER).handlers
                if type(h) is logging.StreamHandler]  # nothing printed


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
    assert core.enable_service() == (False, "not connected to the PIPER yet")
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
