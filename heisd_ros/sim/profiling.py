"""Measurements of the simulator the report quotes: step cost by stage and FK agreement.

Run them from a shell, not from tests (the machine is shared; timings are not assertions)::

    MUJOCO_GL=egl python -c "from heisd_ros.sim.profiling import *; \
        print(measure_step_ms()); print(fk_error_vs_piper_sdk())"
"""

from __future__ import annotations

import time

import mujoco
import numpy as np

from heisd_ros.sim.arm_geometry import JOINT_LIMITS_RAD
from heisd_ros.sim.config import SimConfig
from heisd_ros.sim.env import PiperSimEnv
from heisd_ros.sim.expert import ScriptedExpert
from heisd_ros.sim.scene_mjcf import build_scene_xml
from heisd_ros.sim.suites import get_task


def measure_step_ms(suite: str = "piper_goal", task: str = "stack_blue_on_red",
                    episodes: int = 3, config: SimConfig | None = None) -> dict[str, float]:
    """Milliseconds per control step (IK + physics substeps + both cameras) under the expert.

    Returns medians and 90th percentiles of the whole step and of rendering alone, measured
    with ``perf_counter`` after one warm-up episode.
    """
    cfg = config or SimConfig()
    step_ms, render_ms = [], []
    with PiperSimEnv(get_task(suite, task), cfg) as env:
        expert = ScriptedExpert(env)
        for episode in range(episodes + 1):
            env.reset(episode)
            expert.reset()
            for _ in range(env.task.max_steps):
                action = expert.act()
                start = time.perf_counter()
                result = env.step(action)
                elapsed = time.perf_counter() - start
                start = time.perf_counter()
                env.observe()
                render = time.perf_counter() - start
                if episode > 0:  # the first episode warms caches and the GL context up
                    step_ms.append(elapsed * 1e3)
                    render_ms.append(render * 1e3)
                if result.success:
                    break
    return {"step_ms_median": float(np.median(step_ms)),
            "step_ms_p90": float(np.percentile(step_ms, 90)),
            "observe_ms_median": float(np.median(render_ms)),
            "steps": len(step_ms), "image_px": cfg.image_width_px * cfg.image_height_px}


def fk_error_vs_piper_sdk(samples: int = 200, seed: int = 0) -> dict[str, float]:
    """Max flange error of the MuJoCo model against piper_sdk's own FK.

    The reference is ``C_PiperForwardKinematics(dh_is_offset=1)``; joint angles are drawn
    uniformly inside the limits. Errors are position (m) and orientation (rad).
    """
    from piper_sdk.kinematics.piper_fk import C_PiperForwardKinematics  # optional dependency

    from heisd_ros.geometry.rotations import matrix_to_rotvec, rpy_to_matrix

    sdk = C_PiperForwardKinematics(dh_is_offset=1)
    model = mujoco.MjModel.from_xml_string(build_scene_xml([], []))
    data = mujoco.MjData(model)
    flange = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, "flange")
    rng = np.random.default_rng(seed)
    pos_err, rot_err = 0.0, 0.0
    for _ in range(samples):
        q = rng.uniform(JOINT_LIMITS_RAD[:, 0], JOINT_LIMITS_RAD[:, 1])
        data.qpos[:6] = q
        mujoco.mj_kinematics(model, data)
        ref = np.array(sdk.CalFK(list(q))[-1])  # mm and degrees
        pos_err = max(pos_err, float(np.linalg.norm(data.site_xpos[flange] - ref[:3] / 1e3)))
        rel = rpy_to_matrix(np.deg2rad(ref[3:])).T @ data.site_xmat[flange].reshape(3, 3)
        rot_err = max(rot_err, float(np.linalg.norm(matrix_to_rotvec(rel))))
    return {"max_position_error_m": pos_err, "max_rotation_error_rad": rot_err,
            "samples": samples}
