"""The PIPER driver's CAN link: connecting at start and reopening a lost bus, with back-off.

Without ROS (no rclpy): :class:`LinkSupervisor` is called from the driver's control tick.

- *At start* (and until the controller runs) it connects; a failure (no interface, arm
  silent) is logged once per distinct reason and retried after ``reconnect_period_s``,
  doubling up to ``reconnect_max_period_s``.
- *Later*, while the arm's feedback is missing (``CAN_LOST`` / ``STALE_FEEDBACK``), it reopens
  the CAN port (:meth:`heisd_ros.robot.base.Robot.reopen`) right away and then with the same
  back-off: a bus that died under the driver (adapter unplugged and plugged in again, interface
  recreated) comes back without restarting the node, and a port that cannot be opened stays
  closed, so nothing spins on it. The controller's FAULT stays latched: motion resumes only
  after ``~/clear_fault`` once the feedback is back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from heisd_ros.nodes.driver_report import DriverReport
from heisd_ros.robot.base import Robot, RobotState


class Logger(Protocol):
    """The part of rclpy's logger the core uses (``throttle_duration_sec=`` as a keyword)."""

    def info(self, message: str, **kwargs: Any) -> Any:
        """Log at INFO."""

    def warning(self, message: str, **kwargs: Any) -> Any:
        """Log at WARN."""

    def error(self, message: str, **kwargs: Any) -> Any:
        """Log at ERROR."""


@dataclass
class Backoff:
    """Retry times that double after each failure, from ``first_s`` up to ``max_s``.

    Attributes:
        first_s: wait after the first failure, s.
        max_s: longest wait, s.
        failures: failures since the last reset().
        next_s: when the next attempt is due (monotonic s; -inf: now).
    """

    first_s: float
    max_s: float
    failures: int = 0
    next_s: float = field(default=-math.inf)

    def due(self, now_s: float) -> bool:
        """True when an attempt may be made at ``now_s``."""
        return now_s >= self.next_s

    def failed(self, now_s: float) -> float:
        """Note a failed attempt at ``now_s``; returns the wait before the next one, s."""
        self.failures += 1
        wait = min(self.first_s * 2.0 ** (self.failures - 1), self.max_s)
        self.next_s = now_s + wait
        return wait

    def reset(self) -> None:
        """Success: the next attempt (after a new failure) starts from ``first_s`` again."""
        self.failures, self.next_s = 0, -math.inf


class LinkSupervisor:
    """Connects the robot and reopens its bus while feedback is missing, with back-off.

    Args:
        robot: the robot (its ``connect``/``reopen`` raise one of ``errors`` on failure).
        report: ``connect_error``, ``link_error`` and the ``connect_attempts`` /
            ``link_reopens`` counters go here.
        logger: rclpy-style logger (``info``/``warning``/``error``).
        errors: the exception types that mean "the bus or the arm failed".
        channel: ``(can_channel, interface)`` for messages.
        reconnect_period_s, reconnect_max_period_s: the back-off, s.
    """

    def __init__(
        self,
        robot: Robot,
        report: DriverReport,
        logger: Logger,
        errors: tuple[type[BaseException], ...],
        channel: tuple[str, str],
        reconnect_period_s: float,
        reconnect_max_period_s: float,
    ) -> None:
        self.robot = robot
        self.report = report
        self._log = logger
        self._errors = errors
        self._channel = channel
        self.connect_backoff = Backoff(reconnect_period_s, reconnect_max_period_s)
        self.reopen_backoff = Backoff(reconnect_period_s, reconnect_max_period_s)

    def connect(self, now_s: float) -> bool:
        """Connect when due; True when connected (now or before)."""
        robot, report = self.robot, self.report
        if robot.is_connected:
            return True
        if not self.connect_backoff.due(now_s):
            return False
        try:
            robot.connect()
        except self._errors as exc:
            # Counted once the attempt is over, so a published count and the SDK lines that
            # attempt logged go together (diagnostics run on another thread).
            report.counts["connect_attempts"] += 1
            wait = self.connect_backoff.failed(now_s)
            reason = f"CAN: cannot connect to the PIPER: {exc}"
            if reason != report.connect_error:
                self._log.error(
                    f"{reason}; retrying in {wait:g} s, then less often (every "
                    f"{self.connect_backoff.max_s:g} s at most)"
                )
            report.connect_error = reason
            return False
        report.counts["connect_attempts"] += 1
        self.connect_backoff.reset()
        report.connect_error = ""
        self._log.info(f"connected to the PIPER on '{self._channel[0]}' ({self._channel[1]})")
        return True

    def retry_later(self, now_s: float) -> None:
        """Connected, but the controller could not start: try again after the back-off."""
        self.connect_backoff.failed(now_s)

    def supervise(self, now_s: float, state: RobotState | None, lost: bool) -> None:
        """Reopen the bus when ``lost`` (no feedback in ``state``) and a retry is due."""
        report = self.report
        if not lost:
            if report.link_error:
                self._log.info(f"CAN feedback is back on '{self._channel[0]}'")
            report.link_error = ""
            self.reopen_backoff.reset()
            return
        if not self.robot.is_connected or not self.reopen_backoff.due(now_s):
            return
        report.counts["link_reopens"] += 1
        try:
            self.robot.reopen()
        except self._errors as exc:
            wait = self.reopen_backoff.failed(now_s)
            outcome = f"CAN port on '{self._channel[0]}' cannot be reopened: {exc}"
        else:
            wait = self.reopen_backoff.failed(now_s)  # undone by feedback coming back
            outcome = f"CAN port on '{self._channel[0]}' reopened; waiting for the arm's feedback"
        detail = state.detail if state is not None else ""
        if outcome != report.link_error:
            self._log.error(
                f"CAN feedback lost ({detail}): {outcome}; next try in {wait:g} s (back-off up "
                f"to {self.reopen_backoff.max_s:g} s); holding, ~/clear_fault once it is back"
            )
        report.link_error = outcome
