"""Small rotation helpers for EE poses: roll/pitch/yaw, rotation matrices, rotation vectors.

Convention (the one ``msg/EECommand.msg`` states and the PIPER reports): roll, pitch, yaw are
rotations about the fixed x, y, z axes (extrinsic XYZ), so ``R = Rz(yaw) @ Ry(pitch) @ Rx(roll)``.
piper_sdk's ``C_PiperForwardKinematics.__MatrixToeula`` extracts angles the same way.
"""

from __future__ import annotations

import math

import numpy as np

# Below this rotation angle (rad) the Rodrigues formulas switch to their series form.
_SMALL_ANGLE = 1e-9


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


def wrap_angle(angle: float) -> float:
    """Wrap an angle in rad into (-pi, pi]."""
    wrapped = math.remainder(angle, 2.0 * math.pi)
    return math.pi if wrapped == -math.pi else wrapped
