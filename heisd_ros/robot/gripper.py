"""Strict binary gripper state machine.

Rules (the HeiSD driver contract):

- The gripper is OPEN or CLOSED, never a width chosen by the policy.
- Only commands whose gripper token the target VLA produced itself (``gripper_from_target``)
  count; a skipped (``SOURCE_RETRIEVAL_SKIP``) or relaxed draft never moves the gripper, even
  if it claims otherwise. Other commands are ignored by the gripper: they neither count
  toward a change nor reset one.
- Hysteresis: a change needs the new state on ``hysteresis_steps`` consecutive counted
  commands, so a one-step flicker does not chatter.
- While the gripper moves the arm waits (``should_hold_arm()``) until the gripper reports done
  (opening settled near its target, or stalled on an object) or a timeout; commands that
  arrive meanwhile are ignored by the gripper too.

No I/O and no clock: the caller passes ``now_s`` and the measured opening.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from heisd_ros.robot.base import CommandSource, GripperState


class GripperPhase(str, enum.Enum):
    """IDLE: the arm may move; MOVING: the gripper moves and the arm waits."""

    IDLE = "idle"
    MOVING = "moving"


class DoneReason(str, enum.Enum):
    """How a gripper motion ended."""

    NONE = ""  # no motion finished yet
    REACHED = "reached"  # opening within settle_tolerance_m of the target
    STALLED = "stalled"  # opening stopped changing short of the target (an object)
    TIMEOUT = "timeout"  # neither within timeout_s; the arm continues anyway


@dataclass
class GripperConfig:
    """Settings of the gripper state machine (defaults: PIPER gripper, 0..70 mm).

    Attributes:
        hysteresis_steps: consecutive target-produced commands needed for a change (>= 1).
        open_width_m / closed_width_m: opening commanded for OPEN / CLOSED.
        settle_tolerance_m: done when the opening is this close to its target.
        stall_window_s: done (stalled) when the opening moved less than stall_tolerance_m
            over this long...
        stall_tolerance_m: ...by this much...
        min_motion_s: ...and at least this long has passed since the command (the gripper
            needs time to start moving).
        timeout_s: give up waiting after this long; the arm continues.
    """

    hysteresis_steps: int = 2
    open_width_m: float = 0.07
    closed_width_m: float = 0.0
    settle_tolerance_m: float = 0.003
    stall_window_s: float = 0.3
    stall_tolerance_m: float = 0.0005
    min_motion_s: float = 0.3
    timeout_s: float = 3.0

    def __post_init__(self) -> None:
        if (
            isinstance(self.hysteresis_steps, bool)
            or not isinstance(self.hysteresis_steps, int)
            or self.hysteresis_steps < 1
        ):
            raise ValueError(
                f"hysteresis_steps: expected an int >= 1, got {self.hysteresis_steps!r}"
            )
        for name in ("open_width_m", "closed_width_m"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}: expected a width >= 0 m, got {value!r}")
        if self.open_width_m <= self.closed_width_m:
            raise ValueError(
                f"open_width_m: must exceed closed_width_m={self.closed_width_m}, "
                f"got {self.open_width_m}"
            )
        for name in (
            "settle_tolerance_m",
            "stall_window_s",
            "stall_tolerance_m",
            "min_motion_s",
            "timeout_s",
        ):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name}: expected a finite value > 0, got {value!r}")

    def width_of(self, state: GripperState) -> float:
        """Opening in metres commanded for ``state``."""
        return self.closed_width_m if state == GripperState.CLOSED else self.open_width_m


@dataclass(frozen=True)
class GripperDecision:
    """What one command did to the gripper.

    Attributes:
        state: the gripper's commanded state after this command.
        changed: True when this command started a gripper motion (send ``target_width_m``).
        target_width_m: opening for ``state``.
        counted: True when the command counted toward hysteresis.
        streak: consecutive counted commands asking for the other state.
    """

    state: GripperState
    changed: bool
    target_width_m: float
    counted: bool
    streak: int


class GripperStateMachine:
    """Binary gripper with target-only changes, hysteresis and an arm-wait phase."""

    def __init__(
        self, config: GripperConfig | None = None, initial: GripperState = GripperState.OPEN
    ) -> None:
        self.config = config or GripperConfig()
        self.reset(initial)

    def reset(self, state: GripperState) -> None:
        """Adopt ``state`` as current, idle, with no pending change."""
        self._state = GripperState(state)
        self._phase = GripperPhase.IDLE
        self._streak = 0
        self._started_s = 0.0
        self._ref_width = math.nan
        self._ref_s = 0.0
        self._done_reason = DoneReason.NONE

    def state_from_width(self, width_m: float) -> GripperState:
        """The binary state a measured opening is closest to."""
        middle = (self.config.open_width_m + self.config.closed_width_m) / 2.0
        return GripperState.OPEN if width_m > middle else GripperState.CLOSED

    @property
    def state(self) -> GripperState:
        """Commanded binary state."""
        return self._state

    @property
    def phase(self) -> GripperPhase:
        """IDLE or MOVING."""
        return self._phase

    @property
    def target_width_m(self) -> float:
        """Opening in metres for the commanded state."""
        return self.config.width_of(self._state)

    @property
    def last_done_reason(self) -> DoneReason:
        """How the last motion ended (NONE before the first one ends)."""
        return self._done_reason

    def should_hold_arm(self) -> bool:
        """True while the gripper moves: the arm must not move."""
        return self._phase == GripperPhase.MOVING

    def command(
        self,
        gripper: GripperState,
        from_target: bool,
        now_s: float,
        source: CommandSource | None = None,
    ) -> GripperDecision:
        """Feed one command's gripper part; returns whether a gripper motion starts now."""
        counted = (
            bool(from_target)
            and source != CommandSource.RETRIEVAL_SKIP
            and self._phase == GripperPhase.IDLE
        )
        changed = False
        if counted:
            if GripperState(gripper) == self._state:
                self._streak = 0
            else:
                self._streak += 1
                if self._streak >= self.config.hysteresis_steps:
                    self._state = GripperState(gripper)
                    self._streak = 0
                    self._phase = GripperPhase.MOVING
                    self._started_s = self._ref_s = now_s
                    self._ref_width = math.nan
                    changed = True
        return GripperDecision(self._state, changed, self.target_width_m, counted, self._streak)

    def feedback(self, width_m: float, now_s: float) -> None:
        """Feed the measured opening; ends the MOVING phase when done or timed out."""
        if self._phase != GripperPhase.MOVING:
            return
        elapsed = now_s - self._started_s
        if (
            math.isfinite(width_m)
            and abs(width_m - self.target_width_m) <= self.config.settle_tolerance_m
        ):
            self._finish(DoneReason.REACHED)
            return
        if math.isfinite(width_m):
            if (
                not math.isfinite(self._ref_width)
                or abs(width_m - self._ref_width) > self.config.stall_tolerance_m
            ):
                self._ref_width, self._ref_s = width_m, now_s
            elif (
                elapsed >= self.config.min_motion_s
                and now_s - self._ref_s >= self.config.stall_window_s
            ):
                self._finish(DoneReason.STALLED)
                return
        if elapsed >= self.config.timeout_s:
            self._finish(DoneReason.TIMEOUT)

    def _finish(self, reason: DoneReason) -> None:
        self._phase = GripperPhase.IDLE
        self._done_reason = reason
