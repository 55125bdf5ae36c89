"""Rotations of EE poses: roll/pitch/yaw, matrices, rotation vectors and quaternions (numpy only).

One convention serves the real driver, the simulator, the bags and the ROS messages:

- roll, pitch, yaw (rad) are rotations about the fixed x, y, z axes (extrinsic XYZ), so
  ``R = Rz(yaw) @ Ry(pitch) @ Rx(roll)``: what ``msg/EECommand.msg`` states and the PIPER
  reports (piper_sdk's ``C_PiperForwardKinematics.__MatrixToeula`` extracts angles the same way).
- Quaternions are in ROS order (x, y, z, w) and come out with w >= 0. MuJoCo's (w, x, y, z)
  order exists only at the MuJoCo boundary, as :func:`matrix_to_quat_wxyz`.
- Rotation vectors are axis * angle (rad), angle in [0, pi].
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["matrix_to_quat_wxyz", "matrix_to_quat_xyzw", "matrix_to_rotvec", "matrix_to_rpy",
           "quat_xyzw_to_matrix", "quat_xyzw_to_rpy", "rot_x", "rot_y", "rot_z",
           "rotation_angle", "rotvec_to_matrix", "rpy_to_matrix", "rpy_to_quat_xyzw",
           "wrap_angle"]

# Below this rotation angle (rad) the Rodrigues formulas switch to their series form.
_SMALL_ANGLE = 1e-9


# --- roll/pitch/yaw ------------------------------------------------------------------------
def rpy_to_matrix(rpy: np.ndarray) -> np.ndarray:
    """(3,) roll/pitch/yaw in rad -> (3, 3) rotation matrix, extrinsic XYZ."""
    roll, pitch, yaw = (float(a) for a in rpy)
    cr, sr = math.cos(roll), math.sin(roll)
    cp, sp = math.cos(pitch), math.sin(pitch)
    cy, sy = math.cos(yaw), math.sin(yaw)
    return np.array(
        [
            [cy * cp, cy * sp * sr - sy * cr, cy * sp * cr + sy * sr],
            [sy * cp, sy * sp * sr + cy * cr, sy * sp * cr - cy * sr],
            [-sp, cp * sr, cp * cr],
        ]
    )


def matrix_to_rpy(rot: np.ndarray) -> np.ndarray:
    """(3, 3) rotation matrix -> (3,) roll/pitch/yaw in rad, each in (-pi, pi].

    At gimbal lock (pitch = +-pi/2) yaw is set to 0 and the whole turn goes into roll.
    """
    sin_pitch = -float(rot[2, 0])
    if sin_pitch >= 1.0 - 1e-12:
        return np.array([math.atan2(rot[0, 1], rot[1, 1]), math.pi / 2, 0.0])
    if sin_pitch <= -1.0 + 1e-12:
        return np.array([-math.atan2(rot[0, 1], rot[1, 1]), -math.pi / 2, 0.0])
    pitch = math.atan2(sin_pitch, math.hypot(rot[0, 0], rot[1, 0]))
    yaw = math.atan2(rot[1, 0], rot[0, 0])
    roll = math.atan2(rot[2, 1], rot[2, 2])
    return np.array([roll, pitch, yaw])


def wrap_angle(angle: float) -> float:
    """Wrap an angle in rad into (-pi, pi]."""
    wrapped = math.remainder(angle, 2.0 * math.pi)
    return math.pi if wrapped == -math.pi else wrapped


# --- rotations about one axis --------------------------------------------------------------
def rot_x(angle_rad: float) -> np.ndarray:
    """Rotation about x by ``angle_rad``."""
    c, s = np.cos(angle_rad), np.sin(angle_rad)
    return np.array([[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]])


def rot_y(angle_rad: float) -> np.ndarray:
    """Rotation about y by ``angle_rad``."""
    c, s = np.cos(angle_rad), np.sin(angle_rad)
    return np.array([[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]])


def rot_z(angle_rad: float) -> np.ndarray:
    """Rotation about z by ``angle_rad``."""
    c, s = np.cos(angle_rad), np.sin(angle_rad)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


# --- rotation vectors ----------------------------------------------------------------------
def _skew(v: np.ndarray) -> np.ndarray:
    return np.array([[0.0, -v[2], v[1]], [v[2], 0.0, -v[0]], [-v[1], v[0], 0.0]])


def rotvec_to_matrix(rotvec: np.ndarray) -> np.ndarray:
    """Rotation vector (axis * angle, rad) -> rotation matrix (Rodrigues)."""
    v = np.asarray(rotvec, dtype=np.float64)
    angle = float(np.linalg.norm(v))
    k = _skew(v)
    if angle < _SMALL_ANGLE:
        return np.eye(3) + k
    return np.eye(3) + math.sin(angle) / angle * k + (1.0 - math.cos(angle)) / angle**2 * (k @ k)


def matrix_to_rotvec(rot: np.ndarray) -> np.ndarray:
    """Rotation matrix -> rotation vector with angle in [0, pi] (log map)."""
    cos_angle = max(-1.0, min(1.0, (float(np.trace(rot)) - 1.0) / 2.0))
    angle = math.acos(cos_angle)
    axis_sin = np.array([rot[2, 1] - rot[1, 2], rot[0, 2] - rot[2, 0], rot[1, 0] - rot[0, 1]]) / 2.0
    if angle < 1e-6:
        return axis_sin  # sin(angle) ~ angle
    if angle < math.pi - 1e-4:
        return axis_sin * (angle / math.sin(angle))
    # Near pi the antisymmetric part vanishes; read the axis off the symmetric part.
    sym = (rot + np.eye(3)) / 2.0
    axis = np.sqrt(np.clip(np.diag(sym), 0.0, None))
    i = int(np.argmax(axis))
    for j in range(3):  # signs relative to the largest component
        if j != i and sym[i, j] < 0.0:
            axis[j] = -axis[j]
    if np.dot(axis, axis_sin) < 0.0:
        axis = -axis
    return axis / np.linalg.norm(axis) * angle


def rotation_angle(rot_a: np.ndarray, rot_b: np.ndarray) -> float:
    """Angle in rad of the rotation taking ``rot_a`` to ``rot_b`` (in [0, pi])."""
    return float(np.linalg.norm(matrix_to_rotvec(rot_b @ rot_a.T)))


# --- quaternions ---------------------------------------------------------------------------
def quat_xyzw_to_matrix(quat_xyzw: Sequence[float] | np.ndarray) -> np.ndarray:
    """Quaternion (x, y, z, w), normalised here -> (3, 3) rotation matrix."""
    x, y, z, w = np.asarray(quat_xyzw, dtype=np.float64) / np.linalg.norm(quat_xyzw)
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
            [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
            [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
        ]
    )


def matrix_to_quat_xyzw(mat: np.ndarray) -> np.ndarray:
    """(3, 3) rotation matrix -> unit quaternion (x, y, z, w) with w >= 0."""
    m = np.asarray(mat, dtype=np.float64)
    trace = m[0, 0] + m[1, 1] + m[2, 2]
    # Divide by the largest of 4w^2, 4x^2, 4y^2, 4z^2 (Shepperd) so no branch loses precision.
    if trace > 0.0:
        s = 2.0 * np.sqrt(trace + 1.0)
        q = np.array([(m[2, 1] - m[1, 2]) / s, (m[0, 2] - m[2, 0]) / s,
                      (m[1, 0] - m[0, 1]) / s, 0.25 * s])
    elif m[0, 0] > m[1, 1] and m[0, 0] > m[2, 2]:
        s = 2.0 * np.sqrt(1.0 + m[0, 0] - m[1, 1] - m[2, 2])
        q = np.array([0.25 * s, (m[0, 1] + m[1, 0]) / s, (m[0, 2] + m[2, 0]) / s,
                      (m[2, 1] - m[1, 2]) / s])
    elif m[1, 1] > m[2, 2]:
        s = 2.0 * np.sqrt(1.0 + m[1, 1] - m[0, 0] - m[2, 2])
        q = np.array([(m[0, 1] + m[1, 0]) / s, 0.25 * s, (m[1, 2] + m[2, 1]) / s,
                      (m[0, 2] - m[2, 0]) / s])
    else:
        s = 2.0 * np.sqrt(1.0 + m[2, 2] - m[0, 0] - m[1, 1])
        q = np.array([(m[0, 2] + m[2, 0]) / s, (m[1, 2] + m[2, 1]) / s, 0.25 * s,
                      (m[1, 0] - m[0, 1]) / s])
    q /= np.linalg.norm(q)
    return q if q[3] >= 0.0 else -q


def matrix_to_quat_wxyz(mat: np.ndarray) -> np.ndarray:
    """(3, 3) rotation matrix -> unit quaternion in MuJoCo's order (w, x, y, z), w >= 0."""
    x, y, z, w = matrix_to_quat_xyzw(mat)
    return np.array([w, x, y, z])


def rpy_to_quat_xyzw(rpy_rad: Sequence[float]) -> tuple[float, float, float, float]:
    """Roll/pitch/yaw (extrinsic XYZ, rad) -> quaternion (x, y, z, w) with w >= 0.

    Closed form from the half angles (no matrix in between), as plain floats for a message.
    """
    roll, pitch, yaw = (0.5 * float(a) for a in rpy_rad)
    cr, sr = math.cos(roll), math.sin(roll)
    cp, sp = math.cos(pitch), math.sin(pitch)
    cy, sy = math.cos(yaw), math.sin(yaw)
    # q = q_z(yaw) * q_y(pitch) * q_x(roll): the quaternion of Rz @ Ry @ Rx.
    q = (
        sr * cp * cy - cr * sp * sy,
        cr * sp * cy + sr * cp * sy,
        cr * cp * sy - sr * sp * cy,
        cr * cp * cy + sr * sp * sy,
    )
    return q if q[3] >= 0.0 else (-q[0], -q[1], -q[2], -q[3])


def quat_xyzw_to_rpy(quat_xyzw: Sequence[float] | np.ndarray) -> np.ndarray:
    """Quaternion (x, y, z, w), normalised here -> (3,) roll/pitch/yaw in rad (extrinsic XYZ)."""
    return matrix_to_rpy(quat_xyzw_to_matrix(quat_xyzw))
