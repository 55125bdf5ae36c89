"""Safety filter: EE commands in, safe absolute EE targets out.

For each command it (1) rejects non-finite numbers, foreign frames and duplicated steps with
a reason, (2) turns a delta into an absolute request from the *last commanded* pose,
(3) limits the step from that pose (translation norm, rotation angle), (4) clamps the position
into the workspace box. Step limiting before box clamping keeps both guarantees: the box
projection never moves a point farther from a reference that is inside the box.

Delta rotations are applied about the fixed base axes: ``R_new = R(droll, dpitch, dyaw) @ R_last``
(rotation matrices, not added Euler angles: the PIPER's home orientation has pitch 85 deg,
close to the gimbal lock where added angles misbehave).

No I/O and no clock: the caller passes ``now_s`` (any monotonic seconds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from heisd_ros.robot.base import CommandMode, EECommand, EETarget
from heisd_ros.robot.poses import matrix_to_rotvec, matrix_to_rpy, rotvec_to_matrix, rpy_to_matrix


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
        reject_duplicate_step_index: a command repeating the last accepted step_index is a
            re-delivery; executing its delta twice would double the motion.
    """

    workspace_min_m: tuple[float, float, float] = (0.0, -0.35, 0.10)
    workspace_max_m: tuple[float, float, float] = (0.50, 0.35, 0.50)
    max_step_translation_m: float = 0.02
    max_step_rotation_rad: float = 0.15
    watchdog_timeout_s: float = 1.0
    frame_id: str = "base_link"
    reject_duplicate_step_index: bool = True

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


@dataclass(frozen=True)
class SafetyResult:
    """Outcome of one command.

    Attributes:
        accepted: True when ``target`` should be sent.
        target: the safe absolute target (None when rejected).
        reason: why the command was rejected ("" when accepted).
        clamped: which limits changed the request, e.g. ("step_translation", "workspace_z_max").
    """

    accepted: bool
    target: EETarget | None = None
    reason: str = ""
    clamped: tuple[str, ...] = ()


class SafetyFilter:
    """Stateful filter: holds the last commanded pose, the last step index and the watchdog time."""

    def __init__(self, config: SafetyConfig | None = None) -> None:
        self.config = config or SafetyConfig()
        self._lo = np.asarray(self.config.workspace_min_m, dtype=np.float64)
        self._hi = np.asarray(self.config.workspace_max_m, dtype=np.float64)
        self._position: np.ndarray | None = None
        self._rotation: np.ndarray | None = None
        self._last_step: int | None = None
        self._last_alive_s = -math.inf

    def reset(self, position_m: np.ndarray, rpy_rad: np.ndarray, now_s: float) -> None:
        """Start from a measured pose. Raises ValueError when it lies outside the workspace box."""
        position = np.asarray(position_m, dtype=np.float64).reshape(3)
        rpy = np.asarray(rpy_rad, dtype=np.float64).reshape(3)
        if not (np.all(np.isfinite(position)) and np.all(np.isfinite(rpy))):
            raise ValueError(f"reset pose must be finite, got {position} / {rpy}")
        if np.any(position < self._lo) or np.any(position > self._hi):
            raise ValueError(
                f"the EE at {np.round(position, 4).tolist()} m is outside the workspace box "
                f"{list(self.config.workspace_min_m)}..{list(self.config.workspace_max_m)}: "
                "move the arm into the box (teach mode or joint moves) or widen "
                "workspace_min_m/workspace_max_m"
            )
        self._position, self._rotation = position.copy(), rpy_to_matrix(rpy)
        self._last_step = None
        self._last_alive_s = now_s

    @property
    def reference(self) -> EETarget | None:
        """The last commanded pose (the base of the next delta), or None before reset()."""
        if self._position is None:
            return None
        return EETarget(self._position, matrix_to_rpy(self._rotation))

    def feed_watchdog(self, now_s: float) -> None:
        """Count the policy as alive without executing anything (e.g. while the gripper moves)."""
        self._last_alive_s = max(self._last_alive_s, now_s)

    def watchdog_expired(self, now_s: float) -> bool:
        """True when no command was accepted (or fed) within watchdog_timeout_s."""
        return now_s - self._last_alive_s > self.config.watchdog_timeout_s

    def filter(self, command: EECommand, now_s: float) -> SafetyResult:
        """Check and limit one command; on acceptance it becomes the new reference."""
        if self._position is None:
            raise RuntimeError("SafetyFilter.filter() before reset(): start from a measured pose")
        if not command.is_finite:
            return SafetyResult(
                False,
                reason=f"non-finite command: translation_m={command.translation_m.tolist()} "
                f"rotation_rad={command.rotation_rad.tolist()}",
            )
        if command.frame_id not in ("", self.config.frame_id):
            return SafetyResult(
                False, reason=f"frame_id '{command.frame_id}' is not '{self.config.frame_id}'"
            )
        if self.config.reject_duplicate_step_index and command.step_index == self._last_step:
            return SafetyResult(False, reason=f"duplicate step_index {command.step_index}")

        clamped: list[str] = []
        if command.mode == CommandMode.DELTA:
            req_position = self._position + command.translation_m
            req_rotation = rpy_to_matrix(command.rotation_rad) @ self._rotation
        else:
            req_position = np.array(command.translation_m, dtype=np.float64)
            req_rotation = rpy_to_matrix(command.rotation_rad)

        step = req_position - self._position
        dist = float(np.linalg.norm(step))
        if dist > self.config.max_step_translation_m:
            step *= self.config.max_step_translation_m / dist
            clamped.append("step_translation")
        position = self._position + step
        for axis, name in enumerate("xyz"):
            if position[axis] < self._lo[axis]:
                position[axis] = self._lo[axis]
                clamped.append(f"workspace_{name}_min")
            elif position[axis] > self._hi[axis]:
                position[axis] = self._hi[axis]
                clamped.append(f"workspace_{name}_max")

        rel = matrix_to_rotvec(req_rotation @ self._rotation.T)
        angle = float(np.linalg.norm(rel))
        if angle > self.config.max_step_rotation_rad:
            rel *= self.config.max_step_rotation_rad / angle
            clamped.append("step_rotation")
        rotation = rotvec_to_matrix(rel) @ self._rotation

        self._position, self._rotation = position, rotation
        self._last_step = command.step_index
        self._last_alive_s = max(self._last_alive_s, now_s)
        return SafetyResult(
            True, target=EETarget(position, matrix_to_rpy(rotation)), clamped=tuple(clamped)
        )
