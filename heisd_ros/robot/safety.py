"""Safety filter: EE commands in, safe absolute EE targets out.

For each command it

1. *admits* it (:meth:`SafetyFilter.admit`): refuses duplicated steps, non-finite numbers and
   foreign frames with a reason, and watches the step index: after commands were lost in
   transport (a jump forward by more than 1) the command is refused and the target is
   re-anchored to the measured pose, since integrating the rest of a delta stream would
   command a pose nobody asked for; a step index that goes backwards is a sender that started
   over (a new run or episode): the target is re-anchored and the command runs;
2. *integrates* it (:meth:`SafetyFilter.limit`): a delta becomes an absolute request from the
   last *requested* pose, limited per step (translation norm, rotation angle), kept within one
   step of the released target (see below) and clamped into the workspace box. Step limiting
   before box clamping keeps both guarantees: the box projection never moves a point farther
   from a reference that is inside the box;
3. *releases* it at the speed limits (:meth:`SafetyFilter.release`): the target handed to the
   robot moves toward the requested pose at most ``max_linear_speed_m_s`` /
   ``max_angular_speed_rad_s`` times the time since the last release (the controller releases
   on every command and every tick). A fast stream is slowed down, not reshaped: the requested
   pose integrates every delta (a burst of net-zero deltas ends where it started); only motion
   more than one step ahead of the released target is dropped (clamp ``speed_lead``).

Delta rotations are applied about the fixed base axes: ``R_new = R(droll, dpitch, dyaw) @ R_last``
(rotation matrices, not added Euler angles: the PIPER's home orientation has pitch 85 deg,
close to the gimbal lock where added angles misbehave).

No I/O and no clock: the caller passes ``now_s`` (any monotonic seconds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from heisd_ros.geometry.rotations import (
    matrix_to_rotvec,
    matrix_to_rpy,
    rotvec_to_matrix,
    rpy_to_matrix,
)
from heisd_ros.robot.base import CommandMode, EECommand, EETarget
from heisd_ros.robot.command_stream import StepEvent, classify_step

#: Longest interval one release may use, s: a late tick or a hold never banks motion.
MAX_RELEASE_INTERVAL_S = 0.1


@dataclass
class SafetyConfig:
    """Limits of the safety filter (defaults: a PIPER on a table, flange pose in base_link).

    Attributes:
        workspace_min_m / workspace_max_m: box the flange position is clamped into, metres.
            The default box contains the PIPER's zero pose (0.056, 0, 0.213) and keeps the
            flange 0.1 m above the mounting plane; set it for your cell and tool.
        max_step_translation_m: largest flange displacement per command, metres.
        max_step_rotation_rad: largest flange rotation per command, radians.
        watchdog_timeout_s: without an accepted command for this long the arm holds.
        frame_id: the only frame commands may be expressed in ("" is taken to mean it).
        reject_duplicate_step_index: a command repeating the last step_index is a
            re-delivery; executing its delta twice would double the motion. False: a repeated
            index counts as the next command.
        reanchor_on_step_gap: a step_index more than 1 ahead of the last means commands were
            lost: refuse that command and re-anchor the target to the measured pose; a
            step_index that goes backwards starts a new stream from the measured pose. False:
            every step_index counts as the next command (lost deltas go unnoticed).
        max_linear_speed_m_s: fastest the released target moves, m/s; 0 = no limit (the
            library default, for the simulator; the PIPER driver sets one).
        max_angular_speed_rad_s: fastest the released target turns, rad/s; 0 = no limit.
    """

    workspace_min_m: tuple[float, float, float] = (0.0, -0.35, 0.10)
    workspace_max_m: tuple[float, float, float] = (0.50, 0.35, 0.50)
    max_step_translation_m: float = 0.02
    max_step_rotation_rad: float = 0.15
    watchdog_timeout_s: float = 1.0
    frame_id: str = "base_link"
    reject_duplicate_step_index: bool = True
    reanchor_on_step_gap: bool = True
    max_linear_speed_m_s: float = 0.0
    max_angular_speed_rad_s: float = 0.0

    def __post_init__(self) -> None:
        lo = np.asarray(self.workspace_min_m, dtype=np.float64)
        hi = np.asarray(self.workspace_max_m, dtype=np.float64)
        if lo.shape != (3,) or not np.all(np.isfinite(lo)):
            raise ValueError(
                f"workspace_min_m: expected 3 finite metres, got {self.workspace_min_m!r}"
            )
        if hi.shape != (3,) or not np.all(np.isfinite(hi)):
            raise ValueError(
                f"workspace_max_m: expected 3 finite metres, got {self.workspace_max_m!r}"
            )
        if np.any(hi <= lo):
            raise ValueError(
                f"workspace_max_m: must exceed workspace_min_m {self.workspace_min_m} on every "
                f"axis, got {self.workspace_max_m}"
            )
        for name in ("max_step_translation_m", "max_step_rotation_rad", "watchdog_timeout_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name}: expected a finite value > 0, got {value!r}")
        if self.max_step_rotation_rad > math.pi:
            raise ValueError(
                f"max_step_rotation_rad: expected <= pi, got {self.max_step_rotation_rad}"
            )
        for name in ("max_linear_speed_m_s", "max_angular_speed_rad_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}: expected a finite value >= 0 (0 = off), got {value!r}")


@dataclass(frozen=True)
class Admission:
    """Whether a command may be integrated, and what its step index said.

    Attributes:
        reason: why it is refused ("" when admitted).
        event: how its step_index relates to the previous one.
        lost: commands missing before it (step indices skipped; > 0 only for a gap).
        reanchored: the target was re-anchored (to the measured pose, when one was given).
    """

    reason: str = ""
    event: StepEvent = StepEvent.NEXT
    lost: int = 0
    reanchored: bool = False


@dataclass(frozen=True)
class SafetyResult:
    """Outcome of one command.

    Attributes:
        accepted: True when ``target`` should be sent.
        target: the safe absolute target released now (None when rejected).
        reason: why the command was rejected ("" when accepted).
        clamped: which limits dropped part of the request, e.g. ("step_translation",
            "workspace_z_max"); a speed-limited release only delays motion and is not listed.
        speed_limited: the released target is still short of the request (the rest follows
            on later releases).
    """

    accepted: bool
    target: EETarget | None = None
    reason: str = ""
    clamped: tuple[str, ...] = ()
    speed_limited: bool = False


class SafetyFilter:
    """Stateful filter: the requested and released poses, the last step index, the watchdog."""

    def __init__(self, config: SafetyConfig | None = None) -> None:
        self.config = config or SafetyConfig()
        self._lo = np.asarray(self.config.workspace_min_m, dtype=np.float64)
        self._hi = np.asarray(self.config.workspace_max_m, dtype=np.float64)
        # Requested pose (the base of the next delta) and released pose (sent to the robot).
        self._position: np.ndarray | None = None
        self._rotation: np.ndarray | None = None
        self._out_position: np.ndarray | None = None
        self._out_rotation: np.ndarray | None = None
        self._released_s = -math.inf
        self._last_step: int | None = None
        self._last_alive_s = -math.inf

    def reset(self, position_m: np.ndarray, rpy_rad: np.ndarray, now_s: float) -> None:
        """Start from a measured pose. Raises ValueError when it lies outside the workspace box."""
        position, rpy = self._finite_pose(position_m, rpy_rad)
        if np.any(position < self._lo) or np.any(position > self._hi):
            raise ValueError(
                f"the EE at {np.round(position, 4).tolist()} m is outside the workspace box "
                f"{list(self.config.workspace_min_m)}..{list(self.config.workspace_max_m)}: "
                "move the arm into the box (teach mode or joint moves) or widen "
                "workspace_min_m/workspace_max_m"
            )
        self._anchor(position, rpy_to_matrix(rpy))
        self._released_s = now_s
        self._last_step = None
        self._last_alive_s = now_s

    @property
    def reference(self) -> EETarget | None:
        """The requested pose (the base of the next delta), or None before reset()."""
        if self._position is None:
            return None
        return EETarget(self._position, matrix_to_rpy(self._rotation))

    @property
    def target(self) -> EETarget | None:
        """The released pose (the last target for the robot), or None before reset()."""
        if self._out_position is None:
            return None
        return EETarget(self._out_position, matrix_to_rpy(self._out_rotation))

    @property
    def pending(self) -> bool:
        """True while the released pose is short of the requested one (speed limits)."""
        return self._position is not None and not (
            np.array_equal(self._position, self._out_position)
            and np.array_equal(self._rotation, self._out_rotation)
        )

    def feed_watchdog(self, now_s: float) -> None:
        """Count the policy as alive without executing anything (e.g. while the gripper moves)."""
        self._last_alive_s = max(self._last_alive_s, now_s)

    def watchdog_expired(self, now_s: float) -> bool:
        """True when no command was accepted (or fed) within watchdog_timeout_s."""
        return now_s - self._last_alive_s > self.config.watchdog_timeout_s

    # --- one command -------------------------------------------------------------------------
    def filter(
        self, command: EECommand, now_s: float, measured: EETarget | None = None
    ) -> SafetyResult:
        """:meth:`admit`, then :meth:`limit`: check, integrate and release one command."""
        admission = self.admit(command, measured)
        if admission.reason:
            return SafetyResult(False, reason=admission.reason)
        return self.limit(command, now_s)

    def admit(self, command: EECommand, measured: EETarget | None = None) -> Admission:
        """Check one command before anything acts on it; note its step index.

        Args:
            command: the command.
            measured: the measured EE pose, to re-anchor to after lost commands or when the
                sender starts over; None re-anchors to the released target (stays put).
        """
        if self._position is None:
            raise RuntimeError("SafetyFilter.admit() before reset(): start from a measured pose")
        cfg, step = self.config, command.step_index
        event, lost = classify_step(self._last_step, step)
        if event == StepEvent.DUPLICATE and cfg.reject_duplicate_step_index:
            return Admission(f"duplicate step_index {step}", event)
        self._last_step = step
        reanchored = event in (StepEvent.GAP, StepEvent.RESTART) and cfg.reanchor_on_step_gap
        if reanchored:
            self.reanchor(measured)
            if event == StepEvent.GAP:
                return Admission(
                    f"step_index {step} after {step - lost - 1}: {lost} command(s) lost in "
                    "transport; target re-anchored to the measured pose, integration resumes "
                    f"with step {step + 1}",
                    event,
                    lost,
                    reanchored,
                )
        if not command.is_finite:
            return Admission(
                f"non-finite command: translation_m={command.translation_m.tolist()} "
                f"rotation_rad={command.rotation_rad.tolist()}",
                event,
                lost,
                reanchored,
            )
        if command.frame_id not in ("", cfg.frame_id):
            return Admission(
                f"frame_id '{command.frame_id}' is not '{cfg.frame_id}'", event, lost, reanchored
            )
        return Admission("", event, lost, reanchored)

    def limit(self, command: EECommand, now_s: float) -> SafetyResult:
        """Integrate an admitted command into the requested pose; release toward it."""
        if self._position is None:
            raise RuntimeError("SafetyFilter.limit() before reset(): start from a measured pose")
        cfg = self.config
        clamped: list[str] = []
        if command.mode == CommandMode.DELTA:
            req_position = self._position + command.translation_m
            req_rotation = rpy_to_matrix(command.rotation_rad) @ self._rotation
        else:
            req_position = np.array(command.translation_m, dtype=np.float64)
            req_rotation = rpy_to_matrix(command.rotation_rad)

        step = req_position - self._position
        if _too_long(step, cfg.max_step_translation_m, "step_translation", clamped):
            step = _scaled(step, cfg.max_step_translation_m)
        position = self._position + step
        turn = matrix_to_rotvec(req_rotation @ self._rotation.T)
        if _too_long(turn, cfg.max_step_rotation_rad, "step_rotation", clamped):
            turn = _scaled(turn, cfg.max_step_rotation_rad)
        rotation = rotvec_to_matrix(turn) @ self._rotation
        # At most one step ahead of what was released: a stream faster than the speed limits
        # loses the excess instead of banking it (the arm would run on after it stopped).
        lead = position - self._out_position
        if _too_long(lead, cfg.max_step_translation_m, "speed_lead", clamped):
            position = self._out_position + _scaled(lead, cfg.max_step_translation_m)
        lead = matrix_to_rotvec(rotation @ self._out_rotation.T)
        if _too_long(lead, cfg.max_step_rotation_rad, "speed_lead", clamped):
            rotation = (
                rotvec_to_matrix(_scaled(lead, cfg.max_step_rotation_rad)) @ self._out_rotation
            )
        for axis, name in enumerate("xyz"):
            if position[axis] < self._lo[axis]:
                position[axis] = self._lo[axis]
                clamped.append(f"workspace_{name}_min")
            elif position[axis] > self._hi[axis]:
                position[axis] = self._hi[axis]
                clamped.append(f"workspace_{name}_max")

        self._position, self._rotation = position, rotation
        self._last_alive_s = max(self._last_alive_s, now_s)
        self._advance(now_s)
        return SafetyResult(
            True,
            target=self.target,
            clamped=tuple(dict.fromkeys(clamped)),
            speed_limited=self.pending,
        )

    # --- release, stop, re-anchor ------------------------------------------------------------
    def release(self, now_s: float) -> EETarget | None:
        """Move the released pose toward the requested one at the speed limits.

        Call it periodically (the controller's tick); it also marks ``now_s`` as the last
        release, so a pause never banks motion. Returns the new target when it moved.
        """
        if self._position is None:
            return None
        moving = self.pending
        self._advance(now_s)
        return self.target if moving else None

    def stop(self, now_s: float) -> None:
        """Drop motion not released yet: the requested pose becomes the released one."""
        if self._position is None:
            return
        self._position, self._rotation = self._out_position.copy(), self._out_rotation.copy()
        self._released_s = now_s

    def reanchor(self, measured: EETarget | None) -> None:
        """Requested and released pose := ``measured`` (clamped into the box), or stay put."""
        if measured is None:
            self._anchor(self._out_position, self._out_rotation)
            return
        position, rpy = self._finite_pose(measured.position_m, measured.rpy_rad)
        self._anchor(np.clip(position, self._lo, self._hi), rpy_to_matrix(rpy))

    # --- internals ---------------------------------------------------------------------------
    def _anchor(self, position: np.ndarray, rotation: np.ndarray) -> None:
        self._position, self._rotation = position.copy(), rotation.copy()
        self._out_position, self._out_rotation = position.copy(), rotation.copy()

    def _advance(self, now_s: float) -> None:
        cfg = self.config
        dt = min(max(now_s - self._released_s, 0.0), MAX_RELEASE_INTERVAL_S)
        self._released_s = max(self._released_s, now_s)
        step = self._position - self._out_position
        if cfg.max_linear_speed_m_s > 0 and _too_long(step, cfg.max_linear_speed_m_s * dt):
            self._out_position = self._out_position + _scaled(step, cfg.max_linear_speed_m_s * dt)
        else:  # the whole way fits: the released pose is the request, exactly
            self._out_position = self._position.copy()
        turn = matrix_to_rotvec(self._rotation @ self._out_rotation.T)
        if cfg.max_angular_speed_rad_s > 0 and _too_long(turn, cfg.max_angular_speed_rad_s * dt):
            turn = _scaled(turn, cfg.max_angular_speed_rad_s * dt)
            self._out_rotation = rotvec_to_matrix(turn) @ self._out_rotation
        else:
            self._out_rotation = self._rotation.copy()

    @staticmethod
    def _finite_pose(position_m: np.ndarray, rpy_rad: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        position = np.asarray(position_m, dtype=np.float64).reshape(3)
        rpy = np.asarray(rpy_rad, dtype=np.float64).reshape(3)
        if not (np.all(np.isfinite(position)) and np.all(np.isfinite(rpy))):
            raise ValueError(f"reset pose must be finite, got {position} / {rpy}")
        return position, rpy


def _too_long(vector: np.ndarray, limit: float, name: str = "", clamped=None) -> bool:
    """True when ``vector`` is longer than ``limit`` (then ``name`` is noted in ``clamped``)."""
    if float(np.linalg.norm(vector)) <= limit * (1.0 + 1e-9):  # not for rounding alone
        return False
    if clamped is not None:
        clamped.append(name)
    return True


def _scaled(vector: np.ndarray, length: float) -> np.ndarray:
    """``vector`` scaled to norm ``length`` (it is longer than that, so its norm is > 0)."""
    return vector * (length / float(np.linalg.norm(vector)))
