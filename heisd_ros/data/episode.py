"""One recorded episode in memory: per-step images, robot state, command and success.

Step t pairs the observation taken *before* command t with command t (the (o_t, a_t) pairs
behaviour cloning and the retrieval database need); ``success[t]`` is the task predicate
evaluated *after* command t ran.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from heisd_ros.data.observation import ACTION_DIM, EpisodeState, Observation

#: Joint names of ``joint_positions_rad`` columns and of ``/joint_states`` (the gripper entry
#: carries the opening in metres).
JOINT_STATE_NAMES: tuple[str, ...] = ("joint1", "joint2", "joint3", "joint4", "joint5", "joint6",
                                      "gripper")
#: Layout of the proprio vector the simulator and the episode reader hand to policies.
PROPRIO_NAMES: tuple[str, ...] = ("x_m", "y_m", "z_m", "roll_rad", "pitch_rad", "yaw_rad",
                                  "gripper_width_m")


def make_proprio(ee_position_m: np.ndarray, ee_rpy_rad: np.ndarray,
                 gripper_width_m: float) -> np.ndarray:
    """The float32 proprio vector, laid out as ``PROPRIO_NAMES``."""
    return np.concatenate([np.asarray(ee_position_m, float), np.asarray(ee_rpy_rad, float),
                           [float(gripper_width_m)]]).astype(np.float32)


@dataclass
class EpisodeRecord:
    """Arrays of one episode; T = number of steps, H x W = image size.

    Attributes:
        suite, task, instruction: what was asked.
        seed: the seed the scene was reset with.
        success: the episode's outcome (the predicate held at some step).
        control_rate_hz: step rate.
        image_third_person, image_wrist: (T, H, W, 3) uint8 RGB.
        joint_positions_rad: (T, 6) float32.
        gripper_width_m: (T,) float32.
        ee_position_m: (T, 3) float32, flange in the base frame.
        ee_rpy_rad: (T, 3) float32, extrinsic XYZ.
        ee_quat_xyzw: (T, 4) float32.
        action: (T, 7) float32, the command sent after observation t (dx, dy, dz m; droll,
            dpitch, dyaw rad; gripper 1 = closed, 0 = open).
        stamp_s: (T,) float64, time of observation t.
        step_success: (T,) bool, predicate after command t.
        metadata: free-form JSON-serialisable extras (simulator config, expert name, ...).
    """

    suite: str
    task: str
    instruction: str
    seed: int
    success: bool
    control_rate_hz: float
    image_third_person: np.ndarray
    image_wrist: np.ndarray
    joint_positions_rad: np.ndarray
    gripper_width_m: np.ndarray
    ee_position_m: np.ndarray
    ee_rpy_rad: np.ndarray
    ee_quat_xyzw: np.ndarray
    action: np.ndarray
    stamp_s: np.ndarray
    step_success: np.ndarray
    metadata: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.action)
        expected = {"image_third_person": (n, None, None, 3), "image_wrist": (n, None, None, 3),
                    "joint_positions_rad": (n, 6), "gripper_width_m": (n,),
                    "ee_position_m": (n, 3), "ee_rpy_rad": (n, 3), "ee_quat_xyzw": (n, 4),
                    "action": (n, ACTION_DIM), "stamp_s": (n,), "step_success": (n,)}
        for name, shape in expected.items():
            arr = np.asarray(getattr(self, name))
            mismatch = arr.ndim != len(shape) or any(
                s is not None and s != a for s, a in zip(shape, arr.shape, strict=True))
            if mismatch:
                raise ValueError(f"{name}: expected shape {shape} (T={n}), got {arr.shape}")
        for name in ("image_third_person", "image_wrist"):
            dtype = np.asarray(getattr(self, name)).dtype
            if dtype != np.uint8:
                raise ValueError(f"{name}: expected uint8 images, got {dtype}")
        if n == 0:
            raise ValueError("action: an episode needs at least one step")
        if not self.instruction.strip():
            raise ValueError(f"instruction: expected text, got {self.instruction!r}")

    @property
    def num_steps(self) -> int:
        """Number of steps T."""
        return len(self.action)

    def observation(self, t: int) -> Observation:
        """Observation of step ``t``, as the policy saw it (with the gripper it had)."""
        gripper = float(self.action[t - 1][-1]) if t > 0 else None
        return Observation(
            image_primary=self.image_third_person[t], image_wrist=self.image_wrist[t],
            instruction=self.instruction,
            proprio=make_proprio(self.ee_position_m[t], self.ee_rpy_rad[t],
                                 self.gripper_width_m[t]),
            stamp_s=float(self.stamp_s[t]),
            extras={"joint_positions_rad": np.asarray(self.joint_positions_rad[t], np.float64),
                    "ee_quat_xyzw": np.asarray(self.ee_quat_xyzw[t], np.float64),
                    "suite": self.suite},
            episode=EpisodeState(self.task, t, gripper))


class EpisodeRecorder:
    """Accumulates steps and packs them into an :class:`EpisodeRecord`."""

    def __init__(self, suite: str, task: str, instruction: str, seed: int,
                 control_rate_hz: float, metadata: dict | None = None) -> None:
        self._header = dict(suite=suite, task=task, instruction=instruction, seed=int(seed),
                            control_rate_hz=float(control_rate_hz))
        self._metadata = dict(metadata or {})
        self._steps: list[dict] = []

    def add(self, *, image_third_person: np.ndarray, image_wrist: np.ndarray,
            joint_positions_rad: np.ndarray, gripper_width_m: float, ee_position_m: np.ndarray,
            ee_rpy_rad: np.ndarray, ee_quat_xyzw: np.ndarray, action: np.ndarray, stamp_s: float,
            success: bool) -> None:
        """Append one step (observation before the command, the command, success after it)."""
        self._steps.append(dict(
            image_third_person=image_third_person, image_wrist=image_wrist,
            joint_positions_rad=joint_positions_rad, gripper_width_m=gripper_width_m,
            ee_position_m=ee_position_m, ee_rpy_rad=ee_rpy_rad, ee_quat_xyzw=ee_quat_xyzw,
            action=action, stamp_s=stamp_s, step_success=bool(success)))

    def __len__(self) -> int:
        return len(self._steps)

    def finish(self, success: bool) -> EpisodeRecord:
        """Pack the steps so far into a record with outcome ``success``."""
        def stack(key: str, dtype) -> np.ndarray:
            return np.asarray([step[key] for step in self._steps], dtype=dtype)

        floats = ("joint_positions_rad", "gripper_width_m", "ee_position_m", "ee_rpy_rad",
                  "ee_quat_xyzw", "action")
        return EpisodeRecord(
            **self._header, success=bool(success), metadata=self._metadata,
            image_third_person=stack("image_third_person", np.uint8),
            image_wrist=stack("image_wrist", np.uint8),
            **{key: stack(key, np.float32) for key in floats},
            stamp_s=stack("stamp_s", np.float64), step_success=stack("step_success", bool))
