"""What the PIPER driver node does, without ROS: connect, enable, start, step, hold, answer.

:class:`DriverCore` sits between the node's callbacks and
:class:`~heisd_ros.robot.controller.RobotController`: it connects to a silent arm and reopens a
lost bus with back-off (:mod:`~heisd_ros.nodes.driver_link`), enables the arm once when asked
to, starts the controller, runs each command (with the node's clock for the stamp check) and
tick, turns SDK errors into a hold, and answers the node's services with ``(success,
message)``; ``~/enable`` is refused while the arm is unreachable or the controller is latched.
Nothing here raises for a lost bus or an arm fault; everything ends up in the
:class:`~heisd_ros.nodes.driver_report.DriverReport` and in log lines (piper_sdk's own log
lines are captured and summarised, :mod:`heisd_ros.robot.piper_sdk_log`). Stopping never cuts
motor power (a PIPER drops its arm when disabled): faults and SDK errors *hold* the last target.

No rclpy (only the message helpers of ``robot_msgs``): the node passes its logger (rclpy's,
for ``throttle_duration_sec``) and its clocks.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TypeVar

import can

from heisd_ros.nodes.driver_link import LinkSupervisor, Logger
from heisd_ros.nodes.driver_report import LATCHED, DriverReport
from heisd_ros.nodes.robot_msgs import CAN_FAULTS, fault_message
from heisd_ros.robot.base import EECommand, RobotError
from heisd_ros.robot.controller import ControllerStatus, RobotController, StepResult
from heisd_ros.robot.piper_sdk_log import SdkLogCapture

T = TypeVar("T")

#: What piper_sdk / python-can raise on a broken bus or a disconnected robot.
SDK_ERRORS = (RobotError, can.CanError, OSError)
DISABLE_WARNING = "WARNING: a PIPER without motor power drops its arm: support it before disabling"
#: The controller's reason for a command whose arm part waits for the gripper.
GRIPPER_WAIT_REASON = "arm waits for the gripper"
#: At most one summary line of piper_sdk's captured log lines per this many s.
SDK_LOG_REPORT_S = 10.0


class DriverCore:
    """One PIPER's driver logic around a ready-made controller.

    Args:
        controller: the controller over the robot; None when the node is not configured
            (``report.config_error`` says why; every call then refuses with that reason).
        report: where errors and counters go.
        logger: rclpy-style logger.
        can_channel, interface: for log lines.
        reconnect_period_s: first wait before retrying a silent arm (connecting, starting the
            controller, reopening a lost bus), s; it doubles after each failure...
        reconnect_max_period_s: ...up to this, s.
        enable_on_start: enable the motors once, right after the first connection.
        clock: monotonic seconds.
        stamp_clock: now on the clock of the command stamps (the node's ROS clock), s.
        sdk_log: piper_sdk's captured log lines, summarised in the log and the report.
    """

    def __init__(
        self,
        controller: RobotController | None,
        report: DriverReport,
        logger: Logger,
        *,
        can_channel: str = "",
        interface: str = "",
        reconnect_period_s: float = 2.0,
        reconnect_max_period_s: float = 16.0,
        enable_on_start: bool = False,
        clock: Callable[[], float] = time.monotonic,
        stamp_clock: Callable[[], float] = time.time,
        sdk_log: SdkLogCapture | None = None,
    ) -> None:
        self.controller = controller
        self.report = report
        self.last_result: StepResult | None = None
        self._log = logger
        self._enable_pending = enable_on_start
        self._clock = clock
        self._stamp_clock = stamp_clock
        self._sdk_log = sdk_log
        self._sdk_log_reported = sdk_log.total if sdk_log is not None else 0
        self._next_sdk_log_report = -math.inf
        self.link = (
            LinkSupervisor(
                controller.robot,
                report,
                logger,
                SDK_ERRORS,
                (can_channel, interface),
                reconnect_period_s,
                reconnect_max_period_s,
            )
            if controller is not None
            else None
        )

    # ------------------------------------------------------------------ life cycle
    def started(self, now: float) -> bool:
        """Connect, enable (when configured) and start the controller; True once started."""
        ctl, report = self.controller, self.report
        if ctl is None:
            return False
        if ctl.status != ControllerStatus.NOT_STARTED:
            return True
        if not self.link.connect(now):
            return False
        if not self.link.connect_backoff.due(now):
            return False  # connected, but starting failed a moment ago
        if self._enable_pending:
            self._enable_pending = False  # once: a later failure is reported, not retried
            self.enable()
        try:
            result = ctl.start(now)
        except (ValueError, *SDK_ERRORS) as exc:  # ValueError: the EE is outside the box
            reason = f"controller not started: {exc}"
            if reason != report.start_error:
                self._log.error(reason)
            report.start_error = reason
            self.link.retry_later(now)
            return False
        report.start_error = ""
        self.note(result)
        return True

    def enable(self) -> str:
        """Enable the motors; returns "" or the reason it failed (also logged)."""
        try:
            self.controller.robot.enable()
        except SDK_ERRORS as exc:
            self.report.enable_error = f"enable failed: {exc}"
            self._log.error(self.report.enable_error)
            return self.report.enable_error
        self.report.enable_error = ""
        self._log.info("motors enabled")
        return ""

    def not_ready(self) -> str:
        """Why no command can be executed yet ("" when the controller runs)."""
        return self.report.not_ready(self.controller)

    def disconnect(self) -> None:
        """Close the CAN connection; the motors keep their state (no drop)."""
        if self.controller is not None:
            self.controller.robot.disconnect()

    # ------------------------------------------------------------------ control side
    def call(self, what: str, fn: Callable[[], T]) -> T | None:
        """Run one library call; an SDK error is reported and answered with a hold."""
        try:
            return fn()
        except SDK_ERRORS as exc:
            self.report.sdk_failed(what, exc, self._clock())
            self._log.error(
                f"SDK error in {self.report.sdk_error}; holding", throttle_duration_sec=5.0
            )
            try:
                self.controller.robot.hold()
            except SDK_ERRORS:
                pass  # the bus is gone; the arm keeps its own last target
            return None

    def tick(self) -> None:
        """The control timer: start when possible, the controller's periodic work, the link."""
        now = self._clock()
        if self.started(now):
            result = self.call("tick", lambda: self.controller.tick(now))
            if result is not None:
                self.note(result)
            state = self.last_result.state if self.last_result is not None else None
            lost = state is not None and bool(state.faults & CAN_FAULTS)
            self.link.supervise(now, state, lost)
        self.report_sdk_log(now)

    def refresh_sdk_log_count(self) -> int:
        """Copy the captured piper_sdk line count (and newest line) into the report."""
        capture = self._sdk_log
        if capture is None:
            return 0
        total = capture.total
        self.report.sdk_log_lines, self.report.sdk_log_last = total, capture.last
        return total

    def report_sdk_log(self, now: float) -> None:
        """Count piper_sdk's captured lines; log one summary line per SDK_LOG_REPORT_S."""
        capture = self._sdk_log
        if capture is None:
            return
        total = self.refresh_sdk_log_count()
        if total == self._sdk_log_reported or now < self._next_sdk_log_report:
            return
        self._log.warning(
            f"piper_sdk logged {total - self._sdk_log_reported} line(s) (captured, not "
            f"printed; total on /diagnostics as sdk_log_lines); newest: {capture.last}"
        )
        self._sdk_log_reported = total
        self._next_sdk_log_report = now + SDK_LOG_REPORT_S

    def note(self, result: StepResult) -> None:
        """Keep the newest result for diagnostics; log status changes and a silent bus."""
        before = self.last_result.status if self.last_result is not None else None
        self.last_result = result
        log = self._log
        if result.state is not None and result.state.faults & CAN_FAULTS:
            log.error(
                f"{fault_message(result.state)}; holding (motors stay enabled)",
                throttle_duration_sec=5.0,
            )
        if result.status == before:
            return
        detail = result.detail
        if result.status == ControllerStatus.DISABLED and not detail:
            detail = "motors off, nothing is sent (~/enable)"
        text = f"controller {result.status.value}" + (f": {detail}" if detail else "")
        if result.status in LATCHED:
            log.error(text + "; holding, ~/clear_fault once the cause is gone")
        elif result.status in (ControllerStatus.WATCHDOG_HOLD, ControllerStatus.DISABLED):
            log.warning(text)
        else:
            log.info(text)

    def command(self, command: EECommand) -> None:
        """Run one (well-formed) command, or refuse it with the reason."""
        if reason := self.not_ready():
            self.refuse(command.step_index, f"driver not ready: {reason}")
            return
        now, clock_s = self._clock(), self._stamp_clock()
        result = self.call("step", lambda: self.controller.step(command, now, clock_s))
        if result is None:
            self.refuse(command.step_index, f"SDK error: {self.report.sdk_error}")
            return
        self.note(result)
        self.report.counts["lost"] += result.lost
        self.report.counts["reanchored"] += result.reanchored
        if result.sent is not None and result.sent.gripper_width_m is not None:
            self.report.counts["gripper_changes"] += 1
        if result.rejected_reason:
            waiting = result.rejected_reason == GRIPPER_WAIT_REASON
            self.refuse(command.step_index, result.rejected_reason, quiet=waiting)
            return
        self.report.executed(command.step_index, result.clamped)
        if result.clamped:
            self._log.info(
                f"EECommand clamped: {self.report.last_clamped}", throttle_duration_sec=2.0
            )

    def hold(self, why: str) -> None:
        """Hold the arm now: motion not released yet is dropped, the target stays.

        For a commander that is gone (``driver_commander``): the watchdog would hold only after
        ``safety.watchdog_timeout_s``. Only a RUNNING controller moves; every other status
        holds already. The watchdog then reports ``watchdog_hold``, as no command is accepted.
        """
        ctl = self.controller
        if ctl is None or ctl.status != ControllerStatus.RUNNING:
            return
        now = self._clock()
        if self.call("hold", lambda: (ctl.safety.stop(now), ctl.robot.hold())) is not None:
            self._log.warning(f"holding the arm: {why}")

    def refuse(self, step_index: int, reason: str, quiet: bool = False) -> None:
        """Count and (unless ``quiet``: the arm waits for the gripper) log a refusal."""
        self.report.refused(step_index, reason, quiet)
        if not quiet:
            self._log.warning(
                f"EECommand step {step_index} not executed: {reason}", throttle_duration_sec=2.0
            )

    # ------------------------------------------------------------------ services
    def enable_service(self) -> tuple[bool, str]:
        """``~/enable``: motors on; a disabled controller restarts from the measured pose.

        Refused (with the reason) while the arm cannot be reached (CAN lost), reports a fault,
        or the controller is latched in FAULT/ESTOP (``~/clear_fault`` first): enabling then
        could not be confirmed, or would leave the arm stiff under a controller that holds.
        """
        if reason := self.connected_or_reason() or self.enable_refusal():
            return False, reason
        if error := self.enable():
            return False, error
        now = self._clock()
        self.link.connect_backoff.reset()
        if self.started(now):  # DISABLED -> RUNNING from the measured pose, right away
            result = self.call("tick", lambda: self.controller.tick(now))
            if result is not None:
                self.note(result)
        return True, f"motors enabled; controller {self.controller.status.value}"

    def disable_service(self) -> tuple[bool, str]:
        """``~/disable``: motors off (the answer warns that the arm drops)."""
        if reason := self.connected_or_reason():
            return False, reason
        try:
            self.controller.robot.disable()
        except SDK_ERRORS as exc:
            return False, f"disable failed: {exc}"
        self._log.warning("motors disabled on request: " + DISABLE_WARNING)
        return True, f"motors disabled. {DISABLE_WARNING}. Re-enable with ~/enable."

    def estop_service(self) -> tuple[bool, str]:
        """``~/estop``: the arm's emergency stop; the controller latches ESTOP."""
        if reason := self.connected_or_reason():
            return False, reason
        result = self.call("estop", self.controller.estop)
        if result is None:
            return False, f"estop not sent: {self.report.sdk_error}"
        self.note(result)
        return True, (
            "emergency stop sent to the arm; commands are refused until the arm is reset "
            "(its own reset, 0x150=0x02, cuts motor power: support the arm), then "
            "~/clear_fault and ~/enable"
        )

    def clear_fault_service(self) -> tuple[bool, str]:
        """``~/clear_fault``: leave FAULT/ESTOP once the arm reports no fault."""
        if reason := self.not_ready():
            return False, reason
        try:
            result = self.call("clear_fault", lambda: self.controller.clear_fault(self._clock()))
        except ValueError as exc:  # re-synced from a pose outside the workspace box
            return False, f"fault not cleared: {exc}"
        if result is None:
            return False, self.report.sdk_error
        self.note(result)
        if result.status in LATCHED:
            return False, result.rejected_reason or result.detail or result.status.value
        self.report.clear_sdk_error()
        return True, f"fault cleared; controller {result.status.value}"

    def enable_refusal(self) -> str:
        """Why ``~/enable`` must not enable the motors now ("" when it may)."""
        ctl = self.controller
        try:
            state = ctl.robot.observe()
        except SDK_ERRORS as exc:
            return f"not enabled: cannot read the arm: {exc}"
        if state.faults & CAN_FAULTS:
            return f"not enabled: the arm cannot be reached: {fault_message(state)}"
        if ctl.status in LATCHED:
            detail = (self.last_result.detail if self.last_result is not None else "") or ""
            return (
                f"not enabled: controller is {ctl.status.value}"
                + (f" ({detail})" if detail else "")
                + "; call ~/clear_fault once the cause is gone, then ~/enable"
            )
        if state.faults:
            return f"not enabled: {fault_message(state)}"
        return ""

    def connected_or_reason(self) -> str:
        """Why the arm cannot be commanded (config or connection error); "" when connected."""
        if self.report.config_error:
            return self.report.config_error
        if not self.controller.robot.is_connected:
            return self.report.connect_error or "not connected to the PIPER yet"
        return ""
