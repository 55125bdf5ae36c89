"""The policy node's input gate: pair the newest camera frames, check everything, or say why not.

Pure Python (numpy only, no rclpy): the node converts messages and feeds the gate; the gate
decides whether a step may run on them. The rules:

- both cameras need a new frame since the last pair taken or refused (so a refused pair is
  reported once); the two stamps must lie within ``pair_tolerance_s`` of each other
  ("unpaired frames" otherwise);
- a frame older than ``max_age_s`` ("stale frames") is never acted on; a frame more than
  ``max_future_s`` ahead of the clock ("frame from the future") is refused per camera as it
  arrives, reported once, and blocks only its own camera until that camera's next frame (so
  the good frames that follow are paired with each other, whatever order the cameras come in);
- the newest message of a camera decides: a malformed one (wrong encoding, bad size) blocks
  the camera until a good frame arrives, instead of falling back to an older good frame;
- with ``require_same_size`` both cameras must deliver the same image size ("mismatched
  image sizes");
- the robot state (joints, EE pose, gripper) must be finite ("NaN in the robot state") and
  within ``max_state_skew_s`` of the frames ("stale robot state").

Every refusal is a :class:`GateResult` with a ``problem`` whose first words name the rule, so
the node can log one throttled warning per kind and send nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

CAMERAS = ("third_person", "wrist")


@dataclass(frozen=True)
class InputGateConfig:
    """Freshness and pairing rules.

    Attributes:
        pair_tolerance_s: largest stamp difference between the two camera frames, s.
        max_age_s: frames older than this (to the node's clock) are stale, s.
        max_future_s: frames stamped this far ahead of the node's clock are refused, s.
        max_state_skew_s: largest |state stamp - frame stamp|, s.
        require_same_size: both cameras must have the same width and height.
    """

    pair_tolerance_s: float = 0.05
    max_age_s: float = 0.3
    max_future_s: float = 0.05
    max_state_skew_s: float = 0.5
    require_same_size: bool = True

    def __post_init__(self) -> None:
        for name in ("pair_tolerance_s", "max_age_s", "max_future_s", "max_state_skew_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}: expected a finite value >= 0 s, got {value!r}")
        if self.max_age_s == 0:
            raise ValueError("max_age_s: expected > 0 s, got 0")


@dataclass(frozen=True)
class RobotInput:
    """The robot state the policy sees (from /joint_states and /ee_pose).

    Attributes:
        stamp_s: the newer stamp of the two messages, s.
        joint_positions_rad: (6,) arm joints.
        gripper_width_m: finger opening.
        ee_position_m, ee_rpy_rad: (3,) flange pose in the base frame.
    """

    stamp_s: float
    joint_positions_rad: np.ndarray
    gripper_width_m: float
    ee_position_m: np.ndarray
    ee_rpy_rad: np.ndarray

    def problem(self) -> str:
        """"" when every number is finite, else which values are not."""
        parts = {"joint positions": self.joint_positions_rad, "gripper": [self.gripper_width_m],
                 "EE position": self.ee_position_m, "EE orientation": self.ee_rpy_rad}
        bad = [name for name, values in parts.items()
               if not np.all(np.isfinite(np.asarray(values, dtype=np.float64)))]
        return f"NaN in the robot state: {', '.join(bad)}" if bad else ""


@dataclass(frozen=True)
class Snapshot:
    """One consistent input for a step: both RGB frames and the robot state.

    Attributes:
        stamp_s: the newer of the two frame stamps (the observation time), s.
        third_person, wrist: (H, W, 3) uint8 RGB.
        robot: the robot state, or None when the node does not wait for one.
    """

    stamp_s: float
    third_person: np.ndarray
    wrist: np.ndarray
    robot: RobotInput | None


@dataclass(frozen=True)
class GateResult:
    """A snapshot to act on, or ``problem`` ("" = nothing new yet, just wait)."""

    snapshot: Snapshot | None = None
    problem: str = ""

    @property
    def kind(self) -> str:
        """The rule that refused (text before the first ':'), "" when none did."""
        return self.problem.split(":", 1)[0]


class InputGate:
    """Holds the newest input per source and decides when a step may run (module docstring)."""

    def __init__(self, config: InputGateConfig | None = None, need_robot_state: bool = True):
        self.config = config or InputGateConfig()
        self.need_robot_state = need_robot_state
        self._frames: dict[str, tuple[float, np.ndarray | None, str]] = {}
        self._robot: RobotInput | None = None
        self._robot_problem = "no robot state yet"
        self._used_stamp = -math.inf
        self._last_pair: list[float] | None = None  # stamps of the last taken/refused pair
        self._malformed: tuple[str, float] | None = None
        self._future: dict[str, float] = {}  # camera -> stamp of its refused future frame

    def add_frame(self, camera: str, stamp_s: float, rgb: np.ndarray | None,
                  problem: str = "") -> None:
        """The newest message of ``camera``: an RGB frame, or None and why it is unusable."""
        if camera not in CAMERAS:
            raise ValueError(f"camera: expected one of {CAMERAS}, got {camera!r}")
        self._frames[camera] = (float(stamp_s), rgb, problem)

    def add_robot(self, robot: RobotInput | None, problem: str = "") -> None:
        """The newest robot state, or None and why the message was unusable."""
        self._robot = robot
        self._robot_problem = problem or (robot.problem() if robot is not None else "no state")

    def reset(self, since_s: float | None = None) -> None:
        """Start a new episode: act only on frames of it.

        Args:
            since_s: the episode's start stamp (the sim stamps its reset's frames and status
                alike): held frames stamped before it are dropped, the others kept, so frames
                that overtook the episode's start message still count. None: every held frame
                is dropped (they show the scene before the episode started) and the next step
                waits for new ones from both cameras.

        The mark of used frames is forgotten when the episode's clock went back by more than a
        second (a restarted sim clock), or without ``since_s``.
        """
        if since_s is None:
            self._frames.clear()
        else:
            self._frames = {c: f for c, f in self._frames.items() if f[0] >= since_s}
        if since_s is None or since_s < self._used_stamp - 1.0:
            self._used_stamp = -math.inf
            self._last_pair = None
        self._future.clear()
        self._malformed = None

    def take(self, now_s: float) -> GateResult:
        """A snapshot if both cameras have unused, valid, fresh, paired frames (see module)."""
        cfg = self.config
        if any(camera not in self._frames for camera in CAMERAS):
            return GateResult()
        frames = [self._frames[camera] for camera in CAMERAS]
        stamps = [stamp for stamp, _rgb, _problem in frames]
        future = self._refuse_future_frames(stamps, now_s)
        if future is not None:
            return future
        last = self._last_pair
        if last is not None and any(s == t for s, t in zip(stamps, last, strict=True)):
            return GateResult()  # a camera has nothing new since the last taken/refused pair
        for camera, (stamp, rgb, problem) in zip(CAMERAS, frames, strict=True):
            if rgb is None:  # blocks the camera; reported once per message
                if (camera, stamp) == self._malformed:
                    return GateResult()
                self._malformed = (camera, stamp)
                return self._refuse(f"malformed {camera} image: {problem}")
        newest, oldest = max(stamps), min(stamps)
        if now_s - newest > cfg.max_age_s:
            return self._refuse(f"stale frames: {now_s - newest:.3f} s old (max_age_s "
                                       f"{cfg.max_age_s} s)")
        if oldest <= self._used_stamp:
            return GateResult()  # one camera has nothing new yet
        if newest - oldest > cfg.pair_tolerance_s:
            return self._refuse(f"unpaired frames: third_person and wrist stamps differ "
                                       f"by {newest - oldest:.3f} s (pair_tolerance_s "
                                       f"{cfg.pair_tolerance_s} s)")
        if now_s - oldest > cfg.max_age_s:
            return self._refuse(f"stale frames: {now_s - oldest:.3f} s old (max_age_s "
                                       f"{cfg.max_age_s} s)")
        (_, third, _), (_, wrist, _) = frames
        if cfg.require_same_size and third.shape != wrist.shape:
            return self._refuse(f"mismatched image sizes: third_person {third.shape[1]}x"
                                f"{third.shape[0]}, wrist {wrist.shape[1]}x{wrist.shape[0]}")
        robot = None
        if self.need_robot_state:
            robot = self._robot
            if robot is None or self._robot_problem:
                return self._refuse(self._robot_problem or "no robot state yet")
            if abs(robot.stamp_s - newest) > cfg.max_state_skew_s:
                skew = abs(robot.stamp_s - newest)
                return self._refuse(f"stale robot state: {skew:.3f} s from the frames "
                                           f"(max_state_skew_s {cfg.max_state_skew_s} s)")
        self._used_stamp, self._last_pair = newest, stamps
        return GateResult(Snapshot(newest, third, wrist, robot))

    def _refuse_future_frames(self, stamps: list[float], now_s: float) -> GateResult | None:
        """Refuse the cameras' newest frames stamped ahead of the clock, once; None if none is.

        Every camera whose newest frame is ahead is marked at once, so two future frames that
        are already waiting together give one report; a frame that comes later gets its own.
        """
        ahead_s = self.config.max_future_s
        ahead = {camera: stamp for camera, stamp in zip(CAMERAS, stamps, strict=True)
                 if stamp - now_s > ahead_s}
        new = [camera for camera, stamp in ahead.items() if self._future.get(camera) != stamp]
        if not new:
            return GateResult() if ahead else None  # blocked cameras wait for their next frame
        self._future.update(ahead)
        lead_s = max(ahead[camera] for camera in new) - now_s
        return GateResult(problem=f"frame from the future: {' and '.join(new)} stamped "
                                  f"{lead_s:.3f} s ahead of this node's clock "
                                  f"(max_future_s {ahead_s} s)")

    def _refuse(self, problem: str) -> GateResult:
        # The refused pair is reported once: the next pair needs a new frame from each
        # camera. It does not move the time mark of used frames, so a frame from a wrong
        # clock (far in the future) cannot block the good frames that follow it.
        self._last_pair = [self._frames[camera][0] for camera in CAMERAS]
        return GateResult(problem=problem)
