"""The simulated PIPER's kinematics against piper_sdk's own FK, its limits, and the IK path."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest

from heisd_ros.geometry.rotations import matrix_to_rpy, rpy_to_matrix
from heisd_ros.robot.piper_kinematics import GRIPPER_RANGE_M, JOINT_LIMITS_RAD, JOINT_NAMES
from heisd_ros.sim.config import SimConfig
from heisd_ros.sim.env import PiperSimEnv
from heisd_ros.sim.objects import FixtureSpec, ObjectSpec
from heisd_ros.sim.scene_mjcf import build_scene_xml
from heisd_ros.sim.suites import get_task

piper_fk = pytest.importorskip("piper_sdk.kinematics.piper_fk")

NO_RENDER = SimConfig(render=False, initial_pose_jitter_m=0.0)


@pytest.fixture(scope="module")
def model() -> mujoco.MjModel:
    return mujoco.MjModel.from_xml_string(build_scene_xml([], []))


def test_flange_matches_piper_sdk_fk_over_random_configurations(model):
    sdk = piper_fk.C_PiperForwardKinematics(dh_is_offset=1)
    data = mujoco.MjData(model)
    flange = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, "flange")
    rng = np.random.default_rng(1234)
    pos_err_m, rot_err_rad = [], []
    for _ in range(200):
        q = rng.uniform(JOINT_LIMITS_RAD[:, 0], JOINT_LIMITS_RAD[:, 1])
        data.qpos[:6] = q
        mujoco.mj_kinematics(model, data)
        ref = np.array(sdk.CalFK(list(q))[-1])  # x, y, z mm; roll, pitch, yaw deg
        pos_err_m.append(np.linalg.norm(data.site_xpos[flange] - ref[:3] / 1000.0))
        ref_rot = rpy_to_matrix(np.deg2rad(ref[3:]))
        rel = ref_rot.T @ data.site_xmat[flange].reshape(3, 3)
        rot_err_rad.append(np.arccos(np.clip((np.trace(rel) - 1) / 2, -1, 1)))
    # Measured: ~3e-7 m; the bar is "a few mm" as promised, kept tight to catch a wrong table.
    assert max(pos_err_m) < 1e-4, max(pos_err_m)
    assert max(rot_err_rad) < 1e-3, max(rot_err_rad)


def test_joint_limits_and_gripper_range_match_piper_sdk(model):
    params = pytest.importorskip("piper_sdk.piper_param.piper_param_manager")
    manager = params.C_PiperParamManager()
    for i, name in enumerate(JOINT_NAMES):
        joint = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, name)
        lo, hi = manager.GetJointLimitParam(f"j{i + 1}")
        np.testing.assert_allclose(model.jnt_range[joint], [lo, hi], atol=1e-6)
    assert manager.GetGripperRangeParam() == pytest.approx(GRIPPER_RANGE_M)
    finger = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, "finger_left")
    assert model.jnt_range[finger][1] * 2 == pytest.approx(GRIPPER_RANGE_M[1])


@pytest.fixture(scope="module")
def env():
    # A scene whose objects sit far from the arm's path: the moves below are in free space.
    with PiperSimEnv(get_task("piper_goal", "red_block_on_plate"), NO_RENDER) as sim:
        yield sim


@pytest.mark.parametrize("delta", [
    (0.03, 0.0, 0.0), (0.0, -0.03, 0.0), (0.0, 0.0, -0.03), (0.02, 0.02, 0.02),
])
def test_translation_delta_moves_the_flange_by_that_delta(env, delta):
    env.reset(0)
    before = env.robot_state()
    result = env.step(np.array([*delta, 0.0, 0.0, 0.0, 0.0]))
    moved = result.state.ee_position_m - before.ee_position_m
    np.testing.assert_allclose(moved, delta, atol=0.003)
    # Orientation is held while translating.
    assert _angle(rpy_to_matrix(before.ee_rpy_rad), rpy_to_matrix(result.state.ee_rpy_rad)) < 0.01


def _angle(rot_a: np.ndarray, rot_b: np.ndarray) -> float:
    return float(np.arccos(np.clip((np.trace(rot_a.T @ rot_b) - 1) / 2, -1, 1)))


def test_rotation_delta_is_applied_about_fixed_base_axes(env):
    env.reset(1)
    start = rpy_to_matrix(env.robot_state().ee_rpy_rad)
    d_rpy = np.array([0.0, 0.0, 0.15])
    result = env.step(np.array([0, 0, 0, *d_rpy, 0.0]))
    got = rpy_to_matrix(result.state.ee_rpy_rad)
    assert _angle(rpy_to_matrix(d_rpy) @ start, got) < 0.01


def test_repeated_deltas_track_a_path_without_drift(env):
    env.reset(2)
    start = env.robot_state().ee_position_m
    for _ in range(10):
        env.step(np.array([0.01, 0.005, -0.004, 0, 0, 0, 0]))
    np.testing.assert_allclose(env.robot_state().ee_position_m - start, [0.1, 0.05, -0.04],
                               atol=0.004)


def test_workspace_clamp_and_no_windup(env):
    env.reset(3)
    for _ in range(20):  # push far below the table: z is clamped at the workspace floor
        env.step(np.array([0, 0, -0.05, 0, 0, 0, 0]))
    cmd, _ = env.commanded_pose
    assert cmd[2] >= env.config.workspace_min_m[2] - 1e-6
    assert env.robot_state().ee_position_m[2] > env.config.workspace_min_m[2] - 0.005
    # Coming back up responds at once: the command did not accumulate beyond the clamp.
    z0 = env.robot_state().ee_position_m[2]
    env.step(np.array([0, 0, 0.02, 0, 0, 0, 0]))
    assert env.robot_state().ee_position_m[2] - z0 == pytest.approx(0.02, abs=0.004)


def test_per_step_clamp_limits_a_huge_delta(env):
    env.reset(4)
    before = env.robot_state().ee_position_m
    env.step(np.array([0.5, 0, 0, 0, 0, 0, 0]))
    moved = env.robot_state().ee_position_m[0] - before[0]
    assert moved < env.config.max_step_translation_m + 0.004


def test_gripper_closes_and_opens_in_metres(env):
    env.reset(5)
    assert env.robot_state().gripper_width_m == pytest.approx(GRIPPER_RANGE_M[1], abs=0.002)
    env.step(np.array([0, 0, 0, 0, 0, 0, 1.0]))
    assert env.robot_state().gripper_width_m < 0.005
    env.step(np.array([0, 0, 0, 0, 0, 0, 0.0]))
    assert env.robot_state().gripper_width_m == pytest.approx(GRIPPER_RANGE_M[1], abs=0.003)


def test_absolute_target_seam_reaches_the_pose(env):
    env.reset(6)
    state = env.robot_state()
    target = state.ee_position_m + np.array([0.03, -0.02, 0.01])
    result = env.move_to(target, state.ee_rpy_rad)
    np.testing.assert_allclose(result.state.ee_position_m, target, atol=0.003)
    assert np.allclose(matrix_to_rpy(rpy_to_matrix(result.state.ee_rpy_rad)),
                       result.state.ee_rpy_rad)


def test_scene_rejects_duplicate_names():
    cube = ObjectSpec("a", "box", (0.02, 0.02, 0.02), (1, 0, 0, 1))
    with pytest.raises(ValueError, match="unique"):
        build_scene_xml([cube], [FixtureSpec("a", "plate", 0.07, (1, 1, 1, 1))])


def test_limited_commands_are_reported_and_the_state_stays_finite(env):
    """Impossible commands are clamped, named in ``StepResult.limits``, never NaN."""
    env.reset(6)
    assert env.step(np.array([0.01, 0, 0, 0, 0, 0, 0])).limits == ()
    huge = env.step(np.array([0.5, 0, 0, 0, 0.9, 0, 0]))
    kinds = [text.split(":")[0] for text in huge.limits]
    assert kinds[:2] == ["step translation", "step rotation"], huge.limits
    assert "0.5" in huge.limits[0] and "0.05" in huge.limits[0]
    floor = None
    for _ in range(20):  # into the table: the workspace floor holds
        floor = env.step(np.array([0, 0, -0.05, 0, 0, 0, 0]))
    assert any(text.startswith("workspace:") for text in floor.limits), floor.limits
    twisted = None
    for _ in range(30):  # keep rolling the tool: the joint limits end it
        twisted = env.step(np.array([0, 0, 0, 0.35, 0, 0, 0]))
    assert any(text.startswith("unreachable:") for text in twisted.limits), twisted.limits
    state = twisted.state
    assert np.all(np.isfinite(state.joint_positions_rad)) and np.all(
        np.isfinite(state.ee_position_m))
    with pytest.raises(ValueError):
        env.step(np.array([np.nan, 0, 0, 0, 0, 0, 0]))


def test_the_scripted_expert_rarely_meets_a_limit():
    from heisd_ros.sim.config import SimConfig
    from heisd_ros.sim.expert import ScriptedExpert
    from heisd_ros.sim.suites import get_task

    with PiperSimEnv(get_task("piper_goal", "stack_blue_on_red"),
                     SimConfig(render=False)) as sim:
        expert = ScriptedExpert(sim)
        obs, limited, steps = sim.reset(2), [], 0
        expert.reset(2)
        while steps < 200:
            result = sim.step(expert.act(obs))
            obs, steps = result.observation, steps + 1
            limited += [text.split(":")[0] for text in result.limits]
            if result.success:
                break
    assert result.success and len(limited) <= 0.05 * steps, limited
