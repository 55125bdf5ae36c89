"""The policy node's input gate: pair camera frames, check everything, or say why not.

Pure Python (numpy only, no rclpy): the node converts messages and feeds the gate; the gate
decides whether a step may run on them. The rules:

- pairing follows the rule of every tool (:mod:`heisd_ros.data.pairing`): a third-person
  frame takes the wrist frame nearest to it in stamp, earlier or later, within
  ``pair_tolerance_s``; a wrist frame may serve several third-person frames. Online the
  gate chooses among the frames that have arrived: the newest unused third-person frame
  with a wrist partner is taken, with the nearest partner held (a 30 Hz third-person camera
  with a 10 Hz wrist camera gives two steps of three frames: the frame whose nearest wrist
  frame is still to come waits, and the next frame is newer);
- a third-person frame is acted on or refused once; while its wrist partner may still be on
  its way the gate waits silently. It refuses "unpaired frames" once the wrist camera has
  passed the frame (or the frame went stale) with no wrist frame within the tolerance;
- a frame older than ``max_age_s`` ("stale frames") is never acted on; a wrist camera whose
  newest frame is stale is reported once per frame, without using up the third-person frame;
  a frame more than ``max_future_s`` ahead of the clock ("frame from the future") is refused
  per camera as it arrives, reported once, and blocks only its own camera until that
  camera's next frame (so the good frames that follow are paired with each other, whatever
  order the cameras come in);
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

from heisd_ros.data.pairing import DEFAULT_PAIR_TOLERANCE_S, nearest

CAMERAS = ("third_person", "wrist")
#: Good frames held per camera for pairing (about 1 s of a 30 Hz camera).
HISTORY = 32


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

    pair_tolerance_s: float = DEFAULT_PAIR_TOLERANCE_S
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
    """Holds recent input per source and decides when a step may run (module docstring)."""

    def __init__(self, config: InputGateConfig | None = None, need_robot_state: bool = True):
        self.config = config or InputGateConfig()
        self.need_robot_state = need_robot_state
        self._frames: dict[str, tuple[float, np.ndarray | None, str]] = {}  # newest message
        self._history: dict[str, list[tuple[float, np.ndarray]]] = {c: [] for c in CAMERAS}
        self._robot: RobotInput | None = None
        self._robot_problem = "no robot state yet"
        self._done_stamp = -math.inf  # newest third-person frame taken or refused
        self._stale_wrist: float | None = None  # the stale wrist frame reported
        self._stale_third: float | None = None  # the late, stale third-person frame reported
        self._malformed: tuple[str, float] | None = None
        self._future: dict[str, float] = {}  # camera -> stamp of its refused future frame

    def add_frame(self, camera: str, stamp_s: float, rgb: np.ndarray | None,
                  problem: str = "") -> None:
        """The newest message of ``camera``: an RGB frame, or None and why it is unusable."""
        if camera not in CAMERAS:
            raise ValueError(f"camera: expected one of {CAMERAS}, got {camera!r}")
        stamp = float(stamp_s)
        self._frames[camera] = (stamp, rgb, problem)
        if rgb is not None:
            history = [f for f in self._history[camera] if f[0] != stamp]
            history.append((stamp, rgb))
            history.sort(key=lambda f: f[0])
            self._history[camera] = history[-HISTORY:]

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
            self._history = {c: [] for c in CAMERAS}
        else:
            self._frames = {c: f for c, f in self._frames.items() if f[0] >= since_s}
            self._history = {c: [f for f in h if f[0] >= since_s]
                             for c, h in self._history.items()}
        if since_s is None or since_s < self._done_stamp - 1.0:
            self._done_stamp = -math.inf
        self._future.clear()
        self._malformed = None
        self._stale_wrist = self._stale_third = None

    def take(self, now_s: float) -> GateResult:
        """A snapshot if a fresh, unused third-person frame has a wrist partner (module doc)."""
        cfg = self.config
        if any(camera not in self._frames for camera in CAMERAS):
            return GateResult()
        frames = [self._frames[camera] for camera in CAMERAS]
        future = self._refuse_future_frames([stamp for stamp, _, _ in frames], now_s)
        if future is not None:
            return future
        for camera, (stamp, rgb, problem) in zip(CAMERAS, frames, strict=True):
            if rgb is None:  # blocks the camera; reported once per message
                if (camera, stamp) == self._malformed:
                    return GateResult()
                self._malformed = (camera, stamp)
                return GateResult(problem=f"malformed {camera} image: {problem}")
        newest = frames[0][0]  # a third-person frame older than the last one used
        if newest < self._done_stamp and now_s - newest > cfg.max_age_s \
                and self._stale_third != newest:
            self._stale_third = newest  # reported once
            return GateResult(problem=f"stale frames: {now_s - newest:.3f} s old (max_age_s "
                                      f"{cfg.max_age_s} s)")
        ahead = now_s + cfg.max_future_s
        wrists = [f for f in self._history["wrist"] if f[0] <= ahead]
        wrist_stamps = [stamp for stamp, _ in wrists]
        unused = [f for f in self._history["third_person"] if self._done_stamp < f[0] <= ahead]
        for stamp, third in reversed(unused):  # the newest frame with a partner
            if now_s - stamp > cfg.max_age_s:
                break
            j = nearest(wrist_stamps, stamp, cfg.pair_tolerance_s)
            if j is not None and now_s - wrists[j][0] <= cfg.max_age_s:
                return self._check(stamp, third, *wrists[j])
        if not unused:
            return GateResult()  # nothing new from the third-person camera
        return self._no_partner(unused[-1][0], wrist_stamps, now_s, waited_from=unused[0][0])

    def _no_partner(self, stamp: float, wrist_stamps: list[float], now_s: float,
                    waited_from: float | None = None) -> GateResult:
        """The newest unused third-person frame has no wrist partner: wait, or say why.

        ``waited_from``: the stamp of the oldest third-person frame still waiting. A stale
        wrist camera is named only once a frame has waited longer than the pair tolerance:
        the partner of a frame that just came is usually on its way (a camera driver, or the
        sim, publishes the two one after the other).
        """
        cfg = self.config
        gap = min((abs(w - stamp) for w in wrist_stamps), default=math.inf)
        passed = bool(wrist_stamps) and wrist_stamps[-1] > stamp + cfg.pair_tolerance_s
        if passed or now_s - stamp > cfg.max_age_s:
            self._done_stamp = stamp  # no wrist frame will come for it: refused once
            if math.isfinite(gap) and gap > cfg.pair_tolerance_s:
                return GateResult(problem=f"unpaired frames: no wrist frame within "
                                          f"{cfg.pair_tolerance_s} s of the third_person frame "
                                          f"(nearest {gap:.3f} s away; pair_tolerance_s)")
            return GateResult(problem=f"stale frames: {now_s - stamp:.3f} s old (max_age_s "
                                      f"{cfg.max_age_s} s)")
        newest_wrist = wrist_stamps[-1] if wrist_stamps else None
        waited_s = now_s - (stamp if waited_from is None else waited_from)
        if (newest_wrist is not None and now_s - newest_wrist > cfg.max_age_s
                and waited_s > cfg.pair_tolerance_s):
            if self._stale_wrist == newest_wrist:
                return GateResult()
            self._stale_wrist = newest_wrist  # reported once; the frame waits for a partner
            return GateResult(problem=f"stale frames: the newest wrist frame is "
                                      f"{now_s - newest_wrist:.3f} s old (max_age_s "
                                      f"{cfg.max_age_s} s)")
        return GateResult()  # its wrist partner may still be on its way

    def _check(self, stamp: float, third: np.ndarray, wrist_stamp: float,
               wrist: np.ndarray) -> GateResult:
        """The checks of a pair beyond its stamps; the third-person frame is used either way.

        A refusal here is reported once, as the frame is used up; frames from the future never
        reach this, so a wrong clock cannot move the mark past the good frames that follow.
        """
        cfg = self.config
        self._done_stamp = stamp
        newest = max(stamp, wrist_stamp)
        if cfg.require_same_size and third.shape != wrist.shape:
            return GateResult(problem=f"mismatched image sizes: third_person "
                                      f"{third.shape[1]}x{third.shape[0]}, wrist "
                                      f"{wrist.shape[1]}x{wrist.shape[0]}")
        robot = None
        if self.need_robot_state:
            robot = self._robot
            if robot is None or self._robot_problem:
                return GateResult(problem=self._robot_problem or "no robot state yet")
            if abs(robot.stamp_s - newest) > cfg.max_state_skew_s:
                skew = abs(robot.stamp_s - newest)
                return GateResult(problem=f"stale robot state: {skew:.3f} s from the frames "
                                          f"(max_state_skew_s {cfg.max_state_skew_s} s)")
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
