"""Rotation conventions: rpy is extrinsic XYZ, quaternions are (x, y, z, w); round trips hold."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from heisd_ros.geometry.rotations import (
    matrix_to_quat_wxyz,
    matrix_to_quat_xyzw,
    matrix_to_rotvec,
    matrix_to_rpy,
    quat_xyzw_to_matrix,
    quat_xyzw_to_rpy,
    rot_x,
    rot_y,
    rot_z,
    rotation_angle,
    rotvec_to_matrix,
    rpy_to_matrix,
    rpy_to_quat_xyzw,
    wrap_angle,
)

PACKAGE = Path(__file__).resolve().parents[1] / "heisd_ros"

angles = st.floats(-math.pi, math.pi, allow_nan=False)
#: Pitch away from gimbal lock (+-pi/2), where roll and yaw are not unique.
pitches = st.floats(-1.55, 1.55)
quaternions = st.lists(st.floats(-1, 1), min_size=4, max_size=4)


def _rotvec(axis: list[float], angle: float) -> np.ndarray:
    axis = np.array(axis)
    if np.linalg.norm(axis) < 1e-3:
        axis = np.array([0.0, 0.0, 1.0])
    return axis / np.linalg.norm(axis) * angle


# --- roll/pitch/yaw and rotation vectors ---------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(angles, pitches, angles)
def test_rpy_round_trip_away_from_gimbal_lock(roll, pitch, yaw):
    rpy = np.array([roll, pitch, yaw])
    back = matrix_to_rpy(rpy_to_matrix(rpy))
    assert rotation_angle(rpy_to_matrix(rpy), rpy_to_matrix(back)) < 1e-9
    assert all(abs(wrap_angle(a - b)) < 1e-6 for a, b in zip(rpy, back, strict=True))


def test_rpy_is_extrinsic_xyz():
    # 90 deg about fixed x, then 90 deg about fixed z: x-axis ends up on y.
    rot = rpy_to_matrix([math.pi / 2, 0.0, math.pi / 2])
    assert np.allclose(rot @ [1, 0, 0], [0, 1, 0])
    assert np.allclose(rot @ [0, 1, 0], [0, 0, 1])


@settings(max_examples=100, deadline=None)
@given(angles, angles, angles)
def test_single_axis_rotations_compose_to_rpy(roll, pitch, yaw):
    np.testing.assert_allclose(rot_z(yaw) @ rot_y(pitch) @ rot_x(roll),
                               rpy_to_matrix([roll, pitch, yaw]), atol=1e-12)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1, 1), min_size=3, max_size=3), st.floats(0.0, math.pi))
def test_rotvec_round_trip_including_near_pi(axis, angle):
    rot = rotvec_to_matrix(_rotvec(axis, angle))
    assert np.allclose(rot @ rot.T, np.eye(3), atol=1e-12)
    assert np.allclose(rotvec_to_matrix(matrix_to_rotvec(rot)), rot, atol=1e-6)


# --- quaternions ---------------------------------------------------------------------------
def test_quaternion_follows_the_extrinsic_xyz_convention():
    rng = np.random.default_rng(0)
    for _ in range(200):
        rpy = rng.uniform(-math.pi, math.pi, 3)
        rpy[1] = rng.uniform(-1.5, 1.5)
        q = rpy_to_quat_xyzw(rpy)
        assert q[3] >= 0 and math.isclose(np.linalg.norm(q), 1.0, abs_tol=1e-12)
        np.testing.assert_allclose(quat_xyzw_to_matrix(q), rpy_to_matrix(rpy), atol=1e-12)
    # A quarter turn about the fixed z axis.
    np.testing.assert_allclose(
        rpy_to_quat_xyzw([0, 0, math.pi / 2]), [0, 0, math.sqrt(0.5), math.sqrt(0.5)]
    )


@settings(max_examples=300, deadline=None)
@given(quaternions)
def test_quat_matrix_quat_round_trip_up_to_sign(q):
    q = np.array(q)
    assume(np.linalg.norm(q) > 0.1)
    unit = q / np.linalg.norm(q)
    back = matrix_to_quat_xyzw(quat_xyzw_to_matrix(q))
    assert back[3] >= 0.0 and math.isclose(np.linalg.norm(back), 1.0, abs_tol=1e-12)
    assert min(np.linalg.norm(back - unit), np.linalg.norm(back + unit)) < 1e-9


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(-1, 1), min_size=3, max_size=3), st.floats(0.0, math.pi))
def test_matrix_quat_matrix_round_trip_in_every_branch(axis, angle):
    # Angles near pi drive the trace negative, so each diagonal branch of the conversion runs.
    rot = rotvec_to_matrix(_rotvec(axis, angle))
    np.testing.assert_allclose(quat_xyzw_to_matrix(matrix_to_quat_xyzw(rot)), rot, atol=1e-9)


@settings(max_examples=200, deadline=None)
@given(angles, pitches, angles)
def test_rpy_quat_rpy_round_trip_and_both_quaternion_routes_agree(roll, pitch, yaw):
    rpy = np.array([roll, pitch, yaw])
    q = np.array(rpy_to_quat_xyzw(rpy))
    back = quat_xyzw_to_rpy(q)
    assert all(abs(wrap_angle(a - b)) < 1e-6 for a, b in zip(rpy, back, strict=True))
    via_matrix = matrix_to_quat_xyzw(rpy_to_matrix(rpy))
    assert min(np.linalg.norm(via_matrix - q), np.linalg.norm(via_matrix + q)) < 1e-9


def test_quat_to_matrix_normalises_and_wxyz_is_the_mujoco_order():
    q = np.array(rpy_to_quat_xyzw([0.3, -0.2, 1.1]))
    np.testing.assert_allclose(quat_xyzw_to_matrix(3.0 * q), quat_xyzw_to_matrix(q), atol=1e-12)
    x, y, z, w = matrix_to_quat_xyzw(rot_z(0.7))
    np.testing.assert_allclose(matrix_to_quat_wxyz(rot_z(0.7)), [w, x, y, z])
    np.testing.assert_allclose(matrix_to_quat_wxyz(rot_z(0.7)),
                               [math.cos(0.35), 0.0, 0.0, math.sin(0.35)], atol=1e-12)


# --- layering ------------------------------------------------------------------------------
def _heisd_imports(folder: Path) -> list[str]:
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module
                     else [])
            found += [f"{path.name}: {n}" for n in names if n.startswith("heisd_ros")]
    return found


def test_rotations_import_nothing_of_the_package_and_data_never_imports_sim():
    """Every layer (robot, sim, data, nodes, eval) may use the rotations without pointing up."""
    assert _heisd_imports(PACKAGE / "geometry") == []
    assert [i for i in _heisd_imports(PACKAGE / "data") if ": heisd_ros.sim" in i] == []
