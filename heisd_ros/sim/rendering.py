"""Offscreen rendering of the third-person and wrist cameras.

One ``mujoco.Renderer`` (one GL context) serves both cameras since they share a size. With
``MUJOCO_GL=egl`` this runs on Mesa's CPU rasteriser when no GPU is present.
"""

from __future__ import annotations

import mujoco
import numpy as np

CAMERA_NAMES = ("third_person", "wrist")


class CameraRig:
    """Renders (H, W, 3) uint8 RGB frames of both cameras, or black frames when disabled."""

    def __init__(self, model: mujoco.MjModel, width_px: int, height_px: int, *,
                 enabled: bool = True) -> None:
        self._shape = (height_px, width_px, 3)
        self._renderer = (mujoco.Renderer(model, height=height_px, width=width_px)
                          if enabled else None)
        for name in CAMERA_NAMES:
            if mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, name) < 0:
                raise ValueError(f"model: camera {name!r} missing; cameras are {CAMERA_NAMES}")

    def render(self, data: mujoco.MjData) -> tuple[np.ndarray, np.ndarray]:
        """(third_person, wrist) images of the current state."""
        if self._renderer is None:
            return np.zeros(self._shape, np.uint8), np.zeros(self._shape, np.uint8)
        frames = []
        for name in CAMERA_NAMES:
            self._renderer.update_scene(data, camera=name)
            frames.append(self._renderer.render().copy())
        return frames[0], frames[1]

    def close(self) -> None:
        """Free the GL context (idempotent)."""
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
