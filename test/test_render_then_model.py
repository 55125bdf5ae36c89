"""A process that renders the cameras and then loads the model stack does not crash.

Mesa's EGL (llvmpipe) puts the system libLLVM into the global symbol scope; triton's native
library, imported by torch._dynamo (transformers imports it when a model is built), binds
its LLVM option registration to that other LLVM and dies with SIGSEGV. ``make demo`` hit
this in heisd-build-db right after heisd-collect had rendered. The camera rig loads such
libraries before its GL context (``heisd_ros.sim.rendering.load_llvm_libraries_before_gl``).
The crash needs triton. Every CUDA build of torch brings it; where torch is a CPU build,
scripts/setup.sh adds the triton that torch's PyPI build pins, so this runs the real crash path
on CPU machines too. Without triton the test is skipped: it would pass for the wrong reason.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

_RENDER_THEN_MODEL = textwrap.dedent("""
    import faulthandler, sys
    faulthandler.enable()
    from heisd_ros.sim.config import SimConfig
    from heisd_ros.sim.env import PiperSimEnv
    from heisd_ros.sim.suites import get_task

    with PiperSimEnv(get_task("piper_goal", "stack_blue_on_red"),
                     SimConfig(image_width_px=64, image_height_px=64)) as env:
        frame = env.reset(0).image_primary
    assert frame.std() > 1.0, "the camera rendered a constant frame"
    # What heisd-build-db loads after heisd-collect rendered in the same demo process.
    import transformers.generation.continuous_batching  # noqa: F401  (imports torch._dynamo)
    from heisd_ros.models.loading import load_target
    load_target(None)
    print("triton loaded:", "triton" in sys.modules)
""")


def test_render_then_load_the_model_in_one_process():
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed, and the crash needs it (a CUDA build of torch brings "
                    "it; for a CPU build: pip install -r requirements/triton-for-cpu-torch.txt)")
    env = dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"))
    result = subprocess.run([sys.executable, "-c", _RENDER_THEN_MODEL], capture_output=True,
                            text=True, env=env, timeout=600)
    assert result.returncode == 0, (
        f"exit {result.returncode} (-11 is SIGSEGV)\n{result.stderr[-3000:]}")
    assert "triton loaded: True" in result.stdout
