"""Offscreen rendering of the third-person and wrist cameras.

One ``mujoco.Renderer`` (one GL context) serves both cameras since they share a size. With
``MUJOCO_GL=egl`` this runs on Mesa's CPU rasteriser when no GPU is present.
"""

from __future__ import annotations

import importlib
import importlib.util

import mujoco
import numpy as np

CAMERA_NAMES = ("third_person", "wrist")

# Native libraries that carry their own LLVM and must be loaded before the first GL context.
# Mesa's EGL/OSMesa drivers (llvmpipe, radeonsi) dlopen the system libLLVM into the global
# symbol scope; a library loaded after that whose static initialisers register LLVM command
# line options binds them to Mesa's LLVM of another version and crashes in
# llvm::cl::Option::addArgument (SIGSEGV). triton is one: torch._dynamo imports it when it is
# installed (every CUDA build of torch brings it), and transformers imports torch._dynamo
# lazily, so a process that rendered and then built a model crashed. Loaded first, each
# library keeps its own LLVM and Mesa's loads beside it.
LLVM_LIBRARIES_BEFORE_GL = ("triton",)


def load_llvm_libraries_before_gl() -> tuple[str, ...]:
    """Import the installed ``LLVM_LIBRARIES_BEFORE_GL`` now; return the names imported.

    Called before every GL context this package creates, so the load order is right whatever
    the process does later. A library that is not installed is skipped (nothing to clash);
    one that is installed but fails to import is left to fail where it is used.
    """
    loaded = []
    for name in LLVM_LIBRARIES_BEFORE_GL:
        if importlib.util.find_spec(name) is None:
            continue
        try:
            importlib.import_module(name)
        except ImportError:
            continue
        loaded.append(name)
    return tuple(loaded)


class CameraRig:
    """Renders (H, W, 3) uint8 RGB frames of both cameras, or black frames when disabled."""

    def __init__(self, model: mujoco.MjModel, width_px: int, height_px: int, *,
                 enabled: bool = True) -> None:
        self._shape = (height_px, width_px, 3)
        if enabled:
            load_llvm_libraries_before_gl()
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

    def render_camera(self, data: mujoco.MjData, name: str) -> np.ndarray:
        """The image of camera ``name`` (one of :data:`CAMERA_NAMES`) of the current state."""
        if name not in CAMERA_NAMES:
            raise ValueError(f"name: unknown camera {name!r}; cameras are {CAMERA_NAMES}")
        if self._renderer is None:
            return np.zeros(self._shape, np.uint8)
        self._renderer.update_scene(data, camera=name)
        return self._renderer.render().copy()

    def close(self) -> None:
        """Free the GL context (idempotent)."""
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
