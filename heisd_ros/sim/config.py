"""Configuration of the simulated PIPER tabletop."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SimConfig:
    """Settings of ``PiperSimEnv``.

    Attributes:
        image_width_px, image_height_px: size of both camera images.
        third_person_fovy_deg, wrist_fovy_deg: vertical fields of view.
        render: False skips rendering (observations then carry black frames); for tests of
            physics only.
        control_rate_hz: policy/command rate; physics substeps run in between.
        physics_timestep_s: MuJoCo timestep.
        settle_fraction: share of each control period spent holding the new joint target
            after ramping to it, so the arm has arrived when the next frame is taken.
        workspace_min_m, workspace_max_m: box (base frame) the commanded flange position is
            clamped into, as the real driver's workspace limit.
        max_step_translation_m, max_step_rotation_rad: per-step clamp of a delta command
            (per axis), the driver's per-step limit.
        initial_pose_jitter_m: random offset of the arm's start pose per episode.
    """

    image_width_px: int = 224
    image_height_px: int = 224
    third_person_fovy_deg: float = 55.0
    wrist_fovy_deg: float = 75.0
    render: bool = True
    control_rate_hz: float = 10.0
    physics_timestep_s: float = 0.002
    settle_fraction: float = 0.3
    workspace_min_m: tuple[float, float, float] = (0.08, -0.38, 0.15)
    workspace_max_m: tuple[float, float, float] = (0.55, 0.38, 0.40)
    max_step_translation_m: float = 0.05
    max_step_rotation_rad: float = 0.35
    initial_pose_jitter_m: float = 0.02

    def __post_init__(self) -> None:
        for name in ("image_width_px", "image_height_px"):
            value = getattr(self, name)
            if not isinstance(value, int) or not 16 <= value <= 2048:
                raise ValueError(f"{name}: expected an int in [16, 2048], got {value!r}")
        for name in ("third_person_fovy_deg", "wrist_fovy_deg"):
            if not 10.0 <= getattr(self, name) <= 150.0:
                raise ValueError(f"{name}: expected degrees in [10, 150], "
                                 f"got {getattr(self, name)}")
        if not 1.0 <= self.control_rate_hz <= 100.0:
            raise ValueError(f"control_rate_hz: expected [1, 100], got {self.control_rate_hz}")
        if not 1e-4 <= self.physics_timestep_s <= 0.01:
            raise ValueError(f"physics_timestep_s: expected [1e-4, 0.01], "
                             f"got {self.physics_timestep_s}")
        if self.substeps < 2:
            raise ValueError(f"physics_timestep_s: {self.physics_timestep_s} leaves fewer than 2 "
                             f"substeps per control step at {self.control_rate_hz} Hz")
        if not 0.0 <= self.settle_fraction < 1.0:
            raise ValueError(f"settle_fraction: expected [0, 1), got {self.settle_fraction}")
        lo, hi = np.asarray(self.workspace_min_m), np.asarray(self.workspace_max_m)
        if lo.shape != (3,) or hi.shape != (3,) or np.any(lo >= hi):
            raise ValueError(f"workspace_min_m/workspace_max_m: expected 3 values each with min < "
                             f"max, got {self.workspace_min_m} / {self.workspace_max_m}")
        if self.max_step_translation_m <= 0.0:
            raise ValueError(f"max_step_translation_m: expected > 0, "
                             f"got {self.max_step_translation_m}")
        if self.max_step_rotation_rad <= 0.0:
            raise ValueError(f"max_step_rotation_rad: expected > 0, "
                             f"got {self.max_step_rotation_rad}")
        if self.initial_pose_jitter_m < 0.0:
            raise ValueError(f"initial_pose_jitter_m: expected >= 0, "
                             f"got {self.initial_pose_jitter_m}")

    @property
    def substeps(self) -> int:
        """Physics steps per control step."""
        return int(round(1.0 / (self.control_rate_hz * self.physics_timestep_s)))
