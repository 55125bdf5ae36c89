"""RobotController: a Robot, the safety filter and the gripper state machine, composed.

This is what the PIPER driver node calls (and what the sim node can call): ``step()`` for each
incoming :class:`~heisd_ros.robot.base.EECommand`, ``tick()`` from a timer (watchdog, gripper
progress, fault detection, releasing speed-limited motion). Every call returns a
:class:`StepResult` the node turns into status fields and log lines; nothing here raises for
arm faults or a lost bus.

A command runs only when it is admitted by the safety filter (no duplicate, no lost commands
before it, finite, in the right frame; see :mod:`heisd_ros.robot.safety`) and, when
``ControllerConfig.max_command_age_s`` is set, when its stamp is fresh
(:func:`heisd_ros.robot.command_stream.stamp_problem`); both checks come before the gripper
sees the command.

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
from heisd_ros.robot.command_stream import stamp_problem
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
        max_command_age_s: refuse a command whose stamp (the observation it was decided on)
            is older than this on the caller's clock, s; a zero stamp (no stamp) is refused
            too. None disables the check (the library default: the sim node's commands are
            stamped in sim time); the PIPER driver sets it, and then every ``step()`` needs
            ``clock_s``.
        max_command_future_s: tolerated clock skew: refuse a stamp further ahead than this, s.
    """

    max_tracking_error_m: float | None = 0.10
    max_command_age_s: float | None = None
    max_command_future_s: float = 0.1

    def __post_init__(self) -> None:
        for name in ("max_tracking_error_m", "max_command_age_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name}: expected a value > 0 or None, got {value!r}")
        if not (math.isfinite(self.max_command_future_s) and self.max_command_future_s >= 0):
            raise ValueError(
                f"max_command_future_s: expected seconds >= 0, got {self.max_command_future_s!r}"
            )


@dataclass(frozen=True)
class StepResult:
    """What one step()/tick() did.

    Attributes:
        status: controller status after the call.
        sent: the target sent to the robot by this call (None when nothing new was sent).
        held: True when the robot was told to hold.
        rejected_reason: why the command's arm part was not executed ("" when it was, or for ticks).
        clamped: limits that dropped part of the executed command (step, speed lead, box).
        lost: commands lost in transport before this one (its step_index jumped by 1 + lost).
        reanchored: the target was re-anchored to the measured pose (lost commands, or a
            sender that started a new stream).
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
    lost: int = 0
    reanchored: bool = False
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
    def step(self, command: EECommand, now_s: float, clock_s: float | None = None) -> StepResult:
        """Execute one command (or refuse it with a reason).

        Args:
            command: the command.
            now_s: monotonic seconds (watchdog, speed limits).
            clock_s: now on the clock of the command stamps (the node's ROS clock), s; needed
                when ``config.max_command_age_s`` is set.
        """
        if self._status == ControllerStatus.NOT_STARTED:
            raise RuntimeError("RobotController.step() before start()")
        cfg = self.config
        if cfg.max_command_age_s is not None and clock_s is None:
            raise RuntimeError("RobotController.step(): max_command_age_s is set; pass clock_s")
        state, early = self._check(now_s)
        if early is not None:
            return self._with_reason(early, f"not executed: controller is {early.status.value}")
        admission = self.safety.admit(command, state.ee_target)
        stream = {"lost": admission.lost, "reanchored": admission.reanchored}
        reason = admission.reason
        if not reason and cfg.max_command_age_s is not None:
            reason = stamp_problem(
                command.stamp_s, clock_s, cfg.max_command_age_s, cfg.max_command_future_s
            )
        if admission.reanchored and reason:
            self.robot.act(self.safety.target)  # lost commands: stay where the arm is
        elif reason:  # speed-limited motion already requested still runs out
            self.robot.hold()
        if reason:
            return self._result(state, held=True, rejected_reason=reason, **stream)
        if self.gripper.should_hold_arm():
            self.safety.feed_watchdog(now_s)
            self.robot.hold()
            return self._result(
                state, held=True, rejected_reason="arm waits for the gripper", **stream
            )

        decision = self.gripper.command(
            command.gripper, command.gripper_from_target, now_s, command.source
        )
        if decision.changed:
            # The gripper moves first; this command's arm part is dropped, not deferred (the
            # policy decides again from the observation after the grasp). The arm parks at
            # the released target (motion not released yet is dropped too).
            self.safety.stop(now_s)
            parked = self.safety.target
            target = EETarget(parked.position_m, parked.rpy_rad, decision.target_width_m)
            self.robot.act(target)
            self.safety.feed_watchdog(now_s)
            self._status = ControllerStatus.GRIPPER_WAIT
            return self._result(
                state, sent=target, rejected_reason="arm waits for the gripper", **stream
            )

        result = self.safety.limit(command, now_s)
        self.robot.act(result.target)
        self._status = ControllerStatus.RUNNING
        return self._result(state, sent=result.target, clamped=result.clamped, **stream)

    def tick(self, now_s: float) -> StepResult:
        """Periodic work: faults, gripper progress, watchdog. Call at >= 10 Hz."""
        if self._status == ControllerStatus.NOT_STARTED:
            return self._result(None)
        state, early = self._check(now_s)
        if early is not None:
            return early
        if self._status == ControllerStatus.GRIPPER_WAIT:
            self._hold(now_s)
            return self._result(state, held=True)
        if self.safety.watchdog_expired(now_s):
            self._status = ControllerStatus.WATCHDOG_HOLD
            self._hold(now_s)
            return self._result(
                state,
                held=True,
                detail=f"no accepted command for {self.safety.config.watchdog_timeout_s} s",
            )
        target = self.safety.release(now_s)  # speed-limited motion still on its way
        if target is not None:
            self.robot.act(target)
        return self._result(state, sent=target)

    # --- shared checks -------------------------------------------------------------------------
    def _hold(self, now_s: float) -> None:
        """Stay at the released target; motion not released yet is dropped."""
        self.safety.stop(now_s)
        self.robot.hold()

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
        released = self.safety.target
        if limit is None or released is None:
            return
        error = float(np.linalg.norm(state.ee_position_m - released.position_m))
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
