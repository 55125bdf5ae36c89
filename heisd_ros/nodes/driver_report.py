"""What the PIPER driver node knows about itself: errors by stage, command counters, outcomes.

Pure bookkeeping (no rclpy, no clock): the node records what happened here, and its
diagnostics and service answers read it back. Log lines stay in the node.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from heisd_ros.robot.controller import ControllerStatus, RobotController

#: An SDK error keeps the controller diagnostic at ERROR for this long, in s.
SDK_ERROR_REPORT_S = 5.0
#: Statuses that hold until ``~/clear_fault``.
LATCHED = (ControllerStatus.FAULT, ControllerStatus.ESTOP)
#: The command counters on the controller diagnostic (``commands_<name>``): ``lost`` counts
#: step indices that never arrived, ``reanchored`` the re-anchors to the measured pose,
#: ``foreign`` the commands refused because they did not come from the commander
#: (``heisd_ros.nodes.driver_commander``; per sender in ``refused_publishers``).
COMMAND_COUNTERS = (
    "received",
    "executed",
    "rejected",
    "clamped",
    "waited",
    "gripper_changes",
    "lost",
    "reanchored",
    "foreign",
)
#: The link counters on the arm diagnostic.
LINK_COUNTERS = ("connect_attempts", "link_reopens")


@dataclass
class DriverReport:
    """Errors and counters of one driver node.

    Attributes:
        config_error: invalid parameters ("" when configured); the node then drives nothing.
        connect_error: why the last connection attempt failed ("" once connected).
        link_error: while the arm's feedback is missing: what reopening the CAN port did
            ("" while feedback flows).
        start_error: why the controller could not start (e.g. the EE is outside the box).
        enable_error: why the last enable failed.
        sdk_error: the last piper_sdk / python-can error ("<call>: <type>: <text>").
        sdk_error_at: when ``sdk_error`` happened, monotonic s (-inf: never).
        counts: commands received, executed, rejected, clamped, waited, gripper changes,
            lost (step indices that never arrived), re-anchored, foreign (not from the
            commander: never executed); feedback messages published;
            connection attempts and port reopens.
        sdk_log_lines: piper_sdk log lines captured (not printed) since the start.
        sdk_log_last: the newest of them.
        last_outcome: (what happened to the last command, why) for the diagnostics.
        last_clamped: the last clamped command and the limits that clamped it.
    """

    config_error: str = ""
    connect_error: str = ""
    link_error: str = ""
    start_error: str = ""
    enable_error: str = ""
    sdk_error: str = ""
    sdk_error_at: float = -math.inf
    counts: Counter[str] = field(default_factory=Counter)
    last_outcome: tuple[str, str] = ("", "")
    last_clamped: str = ""
    sdk_log_lines: int = 0
    sdk_log_last: str = ""

    def not_ready(self, controller: RobotController | None) -> str:
        """Why no command can be executed yet ("" when the controller runs)."""
        if self.config_error:
            return self.config_error
        if controller is not None and controller.status != ControllerStatus.NOT_STARTED:
            return ""
        return self.connect_error or self.start_error or "connecting to the PIPER"

    def sdk_failed(self, what: str, exc: Exception, now_s: float) -> None:
        """Record an SDK error in call ``what`` at ``now_s`` (monotonic s)."""
        self.sdk_error = f"{what}: {type(exc).__name__}: {exc}"
        self.sdk_error_at = now_s

    def clear_sdk_error(self) -> None:
        """Forget the last SDK error (a fault was cleared)."""
        self.sdk_error, self.sdk_error_at = "", -math.inf

    def sdk_error_recent(self, now_s: float) -> bool:
        """True while the last SDK error is younger than :data:`SDK_ERROR_REPORT_S`."""
        return now_s - self.sdk_error_at < SDK_ERROR_REPORT_S

    def refused(self, step_index: int, reason: str, quiet: bool = False) -> None:
        """A command was not executed; ``quiet``: its arm part waits for the gripper."""
        self.counts["waited" if quiet else "rejected"] += 1
        outcome = "arm waited" if quiet else "rejected"
        self.last_outcome = (f"step {step_index}: {outcome}", reason)

    def executed(self, step_index: int, clamped: Sequence[str]) -> None:
        """A command was executed, clamped by the limits named in ``clamped`` (if any)."""
        self.counts["executed"] += 1
        self.last_outcome = (f"step {step_index}: executed", "")
        if clamped:
            self.counts["clamped"] += 1
            self.last_clamped = f"step {step_index}: {', '.join(clamped)}"

    def command_counts(self) -> dict[str, int]:
        """The command counters as ``commands_<name>`` diagnostic values."""
        return {f"commands_{k}": self.counts[k] for k in COMMAND_COUNTERS}

    def link_values(self) -> dict[str, object]:
        """The link counters, the reopen outcome and the captured SDK log, for diagnostics."""
        return {
            **{k: self.counts[k] for k in LINK_COUNTERS},
            "link_error": self.link_error,
            "sdk_log_lines": self.sdk_log_lines,
            "sdk_log_last": self.sdk_log_last,
        }
