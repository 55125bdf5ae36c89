"""RobotController: a Robot, the safety filter and the gripper state machine, composed.

This is what the PIPER driver node calls (and what the sim node can call): ``step()`` for each
incoming :class:`~heisd_ros.robot.base.EECommand`, ``tick()`` from a timer (watchdog, gripper
progress, fault detection). Every call returns a :class:`StepResult` the node turns into
status fields and log lines; nothing here raises for arm faults or a lost bus.

Status machine::

    NOT_STARTED --start()--> RUNNING <--> WATCHDOG_HOLD   (no accepted command for timeout_s)
                              RUNNING <--> GRIPPER_WAIT    (gripper moving: the arm holds)
                              RUNNING <--> DISABLED        (motors off: nothing is sent)
    any --robot fault / tracking error--> FAULT   (latched, holds; clear_fault() re-syncs)
    any --estop()--> ESTOP                         (latched; clear_fault() after the arm reset)

Holding never disables motors; it re-sends the last commanded pose (``Robot.hold``).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass

import numpy as np

from heisd_ros.robot.base import EECommand, EETarget, GripperState, Robot, RobotFault, RobotState
from heisd_ros.robot.gripper import GripperPhase, GripperStateMachine
from heisd_ros.robot.safety import SafetyFilter


class ControllerStatus(str, enum.Enum):
    """Where the controller is in its status machine (values go into status messages)."""

    NOT_STARTED = "not_started"
    RUNNING = "running"
    WATCHDOG_HOLD = "watchdog_hold"
    GRIPPER_WAIT = "gripper_wait"
    DISABLED = "disabled"
    FAULT = "fault"
    ESTOP = "estop"


@dataclass
class ControllerConfig:
    """Settings of the controller beyond safety and gripper.

    Attributes:
        max_tracking_error_m: FAULT when the measured flange is farther than this from the
            last commanded position (the arm is not following: blocked, or commands outrun
            it); None disables the check. The arm is then told to stay where it *is*, so a
            blocked arm stops pushing toward its old target.
    """

    max_tracking_error_m: float | None = 0.10

    def __post_init__(self) -> None:
        if self.max_tracking_error_m is not None and not (
            math.isfinite(self.max_tracking_error_m) and self.max_tracking_error_m > 0
        ):
            raise ValueError(
                "max_tracking_error_m: expected metres > 0 or None, "
                f"got {self.max_tracking_error_m!r}"
            )


@dataclass(frozen=True)
class StepResult:
    """What one step()/tick() did.

    Attributes:
        status: controller status after the call.
        sent: the target sent to the robot by this call (None when nothing new was sent).
        held: True when the robot was told to hold.
        rejected_reason: why the command's arm part was not executed ("" when it was, or for ticks).
        clamped: limits the safety filter applied to the executed command.
        gripper: commanded gripper state; gripper_phase: idle or moving.
        faults: faults behind a FAULT status (robot faults, or none for a tracking error).
        detail: human-readable explanation for logs.
        state: the robot state observed in this call (None before start()).
    """

    status: ControllerStatus
    sent: EETarget | None = None
    held: bool = False
    rejected_reason: str = ""
    clamped: tuple[str, ...] = ()
    gripper: GripperState = GripperState.OPEN
    gripper_phase: GripperPhase = GripperPhase.IDLE
    faults: frozenset[RobotFault] = frozenset()
    detail: str = ""
    state: RobotState | None = None


class RobotController:
    """Drive a :class:`Robot` from EE commands, safely. Collaborators come in ready-made."""

    def __init__(
        self,
        robot: Robot,
        safety: SafetyFilter,
        gripper: GripperStateMachine,
        config: ControllerConfig | None = None,
    ) -> None:
        self.robot = robot
        self.safety = safety
        self.gripper = gripper
        self.config = config or ControllerConfig()
        self._status = ControllerStatus.NOT_STARTED
        self._faults: frozenset[RobotFault] = frozenset()
        self._detail = ""

    @property
    def status(self) -> ControllerStatus:
        """Current status (see the module docstring)."""
        return self._status

    # --- life cycle --------------------------------------------------------------------------
    def start(self, now_s: float) -> StepResult:
        """Adopt the measured pose and gripper opening as the starting reference.

        Raises ValueError when the EE is outside the safety workspace box (move it in first).
        """
        state = self.robot.observe()
        if state.faults:
            self._status = ControllerStatus.FAULT
            self._faults, self._detail = state.faults, state.detail
            return self._result(state)
        self._sync(state, now_s)
        return self._result(state)

    def clear_fault(self, now_s: float) -> StepResult:
        """Leave FAULT/ESTOP when the robot reports no fault; re-sync from the measured pose."""
        state = self.robot.observe()
        if state.faults:
            return self._result(
                state, rejected_reason=f"robot still reports faults: {state.detail}"
            )
        self._sync(state, now_s)
        return self._result(state)

    def estop(self) -> StepResult:
        """Emergency-stop the robot and latch ESTOP until clear_fault()."""
        self.robot.estop()
        self._status = ControllerStatus.ESTOP
        self._detail = "emergency stop requested"
        return self._result(None)

    def _sync(self, state: RobotState, now_s: float) -> None:
        self.safety.reset(state.ee_position_m, state.ee_rpy_rad, now_s)
        self.gripper.reset(self.gripper.state_from_width(state.gripper_width_m))
        self._faults, self._detail = frozenset(), ""
        self._status = ControllerStatus.RUNNING if state.enabled else ControllerStatus.DISABLED

    # --- per command ---------------------------------------------------------------------------
    def step(self, command: EECommand, now_s: float) -> StepResult:
        """Execute one command (or refuse it with a reason)."""
        if self._status == ControllerStatus.NOT_STARTED:
            raise RuntimeError("RobotController.step() before start()")
        state, early = self._check(now_s)
        if early is not None:
            return self._with_reason(early, f"not executed: controller is {early.status.value}")
        if self.gripper.should_hold_arm():
            if command.is_finite:
                self.safety.feed_watchdog(now_s)
            self.robot.hold()
            return self._result(state, held=True, rejected_reason="arm waits for the gripper")

        decision = self.gripper.command(
            command.gripper, command.gripper_from_target, now_s, command.source
        )
        if decision.changed:
            # The gripper moves first; this command's arm part is dropped, not deferred (the
            # policy decides again from the observation after the grasp).
            reference = self.safety.reference
            target = EETarget(reference.position_m, reference.rpy_rad, decision.target_width_m)
            self.robot.act(target)
            self.safety.feed_watchdog(now_s)
            self._status = ControllerStatus.GRIPPER_WAIT
            return self._result(state, sent=target, rejected_reason="arm waits for the gripper")

        result = self.safety.filter(command, now_s)
        if not result.accepted:
            self.robot.hold()
            return self._result(state, held=True, rejected_reason=result.reason)
        self.robot.act(result.target)
        self._status = ControllerStatus.RUNNING
        return self._result(state, sent=result.target, clamped=result.clamped)

    def tick(self, now_s: float) -> StepResult:
        """Periodic work: faults, gripper progress, watchdog. Call at >= 10 Hz."""
        if self._status == ControllerStatus.NOT_STARTED:
            return self._result(None)
        state, early = self._check(now_s)
        if early is not None:
            return early
        if self._status == ControllerStatus.GRIPPER_WAIT:
            self.robot.hold()
            return self._result(state, held=True)
        if self.safety.watchdog_expired(now_s):
            self._status = ControllerStatus.WATCHDOG_HOLD
            self.robot.hold()
            return self._result(
                state,
                held=True,
                detail=f"no accepted command for {self.safety.config.watchdog_timeout_s} s",
            )
        return self._result(state)

    # --- shared checks -------------------------------------------------------------------------
    def _check(self, now_s: float) -> tuple[RobotState, StepResult | None]:
        """Observe and update the status; returns an early result when no motion may happen."""
        state = self.robot.observe()
        if self._status == ControllerStatus.ESTOP:
            return state, self._result(state)
        if state.faults:
            self._status = ControllerStatus.FAULT
            self._faults, self._detail = state.faults, state.detail
        elif (
            self._status not in (ControllerStatus.FAULT, ControllerStatus.DISABLED)
            and state.enabled
        ):
            self._check_tracking(state)
        if self._status == ControllerStatus.FAULT:
            self.robot.hold()
            return state, self._result(state, held=True)
        if not state.enabled:
            self._status = ControllerStatus.DISABLED
            return state, self._result(state, detail="motors disabled: enable the arm")
        if self._status == ControllerStatus.DISABLED:
            # Re-enabled: the arm may have moved (a PIPER sags when disabled); start over from it.
            try:
                self._sync(state, now_s)
            except ValueError as exc:
                self._status, self._faults, self._detail = (
                    ControllerStatus.FAULT,
                    frozenset(),
                    str(exc),
                )
                return state, self._result(state)
        self.gripper.feedback(state.gripper_width_m, now_s)
        if self._status == ControllerStatus.GRIPPER_WAIT and not self.gripper.should_hold_arm():
            self._status = ControllerStatus.RUNNING
            self.safety.feed_watchdog(now_s)
        elif self._status == ControllerStatus.WATCHDOG_HOLD and not self.safety.watchdog_expired(
            now_s
        ):
            self._status = ControllerStatus.RUNNING
        return state, None

    def _check_tracking(self, state: RobotState) -> None:
        limit = self.config.max_tracking_error_m
        reference = self.safety.reference
        if limit is None or reference is None:
            return
        error = float(np.linalg.norm(state.ee_position_m - reference.position_m))
        if error > limit:
            self.robot.act(state.ee_target)  # later holds re-send this, not the old target
            self._status = ControllerStatus.FAULT
            self._faults = frozenset()
            self._detail = (
                f"tracking error: flange is {error:.3f} m from the commanded position "
                f"(limit {limit} m); the arm is blocked or commands outrun it"
            )

    def _result(self, state: RobotState | None, **kwargs: object) -> StepResult:
        kwargs.setdefault("detail", self._detail)
        return StepResult(
            status=self._status,
            gripper=self.gripper.state,
            gripper_phase=self.gripper.phase,
            faults=self._faults,
            state=state,
            **kwargs,
        )

    @staticmethod
    def _with_reason(result: StepResult, reason: str) -> StepResult:
        return dataclasses.replace(result, rejected_reason=reason)
