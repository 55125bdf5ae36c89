"""The observation and action records shared by the simulator, the decoders and the nodes."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: Names of the 7 action dimensions, in token order (OpenVLA's layout).
ACTION_DIM_NAMES: tuple[str, ...] = ("dx_m", "dy_m", "dz_m", "droll_rad", "dpitch_rad",
                                     "dyaw_rad", "gripper")
ACTION_DIM = len(ACTION_DIM_NAMES)


def _check_image(name: str, image: np.ndarray) -> None:
    if not isinstance(image, np.ndarray):
        raise ValueError(f"{name}: expected a numpy array, got {type(image).__name__}")
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"{name}: expected shape (H, W, 3) RGB, got {image.shape}")
    if image.dtype != np.uint8:
        raise ValueError(f"{name}: expected dtype uint8, got {image.dtype}")
    if image.shape[0] < 8 or image.shape[1] < 8:
        raise ValueError(f"{name}: image of {image.shape[:2]} pixels is too small")


#: A gripper command above this value closes the gripper (OpenVLA's convention: 1 = closed).
GRIPPER_CLOSED_ABOVE = 0.5


@dataclass(frozen=True)
class EpisodeState:
    """An episode as the robot executed it so far: what the decoders may assume about it.

    One value per control loop, owned by the loop that sends the commands (the policy node,
    the evaluation's ``DecoderPolicy``, the demonstration a frame was recorded in). The loop
    hands it to every observation and advances it with :meth:`executed` only once a command
    was sent: a command held back (stale, refused) leaves it unchanged, so no decoder acts on
    a gripper state the robot never got.

    Attributes:
        task: the task name (the retrieval DB collection); None: the instruction is the key.
        step_index: the step being decided; 0 starts an episode (decoders drop their history).
        gripper: the gripper value of the last executed command; None before the first.
    """

    task: str | None = None
    step_index: int = 0
    gripper: float | None = None

    def __post_init__(self) -> None:
        """Refuse a negative step or a non-finite gripper value."""
        if int(self.step_index) != self.step_index or self.step_index < 0:
            raise ValueError(f"step_index: expected an integer >= 0, got {self.step_index!r}")
        if self.gripper is not None and not np.isfinite(self.gripper):
            raise ValueError(f"gripper: expected a finite value or None, got {self.gripper!r}")

    @property
    def starting(self) -> bool:
        """True at an episode's first step."""
        return self.step_index == 0

    @property
    def gripper_closed(self) -> bool | None:
        """The gripper's state after the last executed command; None before the first."""
        return None if self.gripper is None else bool(self.gripper > GRIPPER_CLOSED_ABOVE)

    def executed(self, action: np.ndarray) -> EpisodeState:
        """The state after ``action`` (a 7-D action, gripper last) was sent to the robot."""
        return EpisodeState(self.task, self.step_index + 1, float(np.asarray(action)[-1]))


@dataclass(frozen=True)
class Observation:
    """What a policy sees at one control step.

    Attributes:
        image_primary: third-person camera, (H, W, 3) uint8 RGB.
        image_wrist: wrist camera, (H, W, 3) uint8 RGB, or None when the robot has none.
        instruction: natural-language task instruction.
        proprio: optional proprioception, float32 vector (e.g. EE pose in m/rad + gripper).
        stamp_s: observation time in seconds (the newer of the paired frames).
        episode: where the episode stands (task, step, executed gripper); None: unknown
            (decoders then keep no history and assume nothing about the gripper).
        extras: free-form per-frame data of the source (joint angles, recording indices).
    """

    image_primary: np.ndarray
    image_wrist: np.ndarray | None
    instruction: str
    proprio: np.ndarray | None = None
    stamp_s: float = 0.0
    episode: EpisodeState | None = field(default=None, compare=False)
    extras: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        """Reject malformed input early with a message naming the field."""
        _check_image("image_primary", self.image_primary)
        if self.image_wrist is not None:
            _check_image("image_wrist", self.image_wrist)
        if not isinstance(self.instruction, str) or not self.instruction.strip():
            raise ValueError(f"instruction: expected a non-empty string, got {self.instruction!r}")
        if self.proprio is not None:
            proprio = np.asarray(self.proprio, dtype=np.float32)
            if proprio.ndim != 1 or not np.all(np.isfinite(proprio)):
                raise ValueError(f"proprio: expected a finite 1-D vector, got {proprio!r}")
            object.__setattr__(self, "proprio", proprio)
        if not np.isfinite(self.stamp_s):
            raise ValueError(f"stamp_s: expected a finite time, got {self.stamp_s}")


def check_action(action: np.ndarray) -> np.ndarray:
    """Return ``action`` as a float64 (7,) vector, or raise ValueError saying what is wrong."""
    arr = np.asarray(action, dtype=np.float64)
    if arr.shape != (ACTION_DIM,):
        raise ValueError(f"action: expected shape ({ACTION_DIM},), got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"action: expected finite values, got {arr.tolist()}")
    return arr
