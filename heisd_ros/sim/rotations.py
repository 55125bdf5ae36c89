"""Rotation helpers of the simulator, on top of the project's pose conventions.

roll/pitch/yaw <-> matrix and rotation vectors come from ``heisd_ros.robot.poses`` (extrinsic
XYZ, ``R = Rz(yaw) @ Ry(pitch) @ Rx(roll)``, the convention of piper_sdk and EECommand.msg), so
the simulator and the real driver agree by construction. Quaternions are stored in ROS order
(x, y, z, w); MuJoCo's (w, x, y, z) order is converted only at the MuJoCo boundary.
"""

from __future__ import annotations

import numpy as np

from heisd_ros.robot.poses import matrix_to_rotvec, matrix_to_rpy, rpy_to_matrix

__all__ = ["matrix_to_quat_xyzw", "matrix_to_rotvec", "matrix_to_rpy", "quat_xyzw_to_matrix",
           "rot_x", "rot_y", "rot_z", "rpy_to_matrix", "tool_down_rotation"]


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


def matrix_to_quat_xyzw(mat: np.ndarray) -> np.ndarray:
    """3x3 rotation matrix -> unit quaternion (x, y, z, w) with w >= 0."""
    m = np.asarray(mat, dtype=np.float64)
    trace = m[0, 0] + m[1, 1] + m[2, 2]
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


def quat_xyzw_to_matrix(quat_xyzw: np.ndarray) -> np.ndarray:
    """Unit quaternion (x, y, z, w) -> 3x3 rotation matrix."""
    x, y, z, w = np.asarray(quat_xyzw, dtype=np.float64) / np.linalg.norm(quat_xyzw)
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
        [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
        [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
    ])


def tool_down_rotation(closing_dir_xy: np.ndarray, outward_dir_xy: np.ndarray,
                       tilt_rad: float) -> np.ndarray:
    """Flange rotation for a top-down grasp: tool z points down, tilted towards ``outward``.

    The fingers close along the flange y axis, which is set to the horizontal
    ``closing_dir_xy``. The tool leans by up to ``tilt_rad`` towards ``outward_dir_xy`` (only
    the part of it perpendicular to the closing direction, so the finger pads stay vertical).
    Leaning away from the base is what lets the PIPER, whose wrist pitch (joint 5) stops at
    +-70 degrees, reach a downward pose more than ~0.22 m above its base.
    """
    closing = np.array([closing_dir_xy[0], closing_dir_xy[1], 0.0], dtype=np.float64)
    closing /= np.linalg.norm(closing)
    outward = np.array([outward_dir_xy[0], outward_dir_xy[1], 0.0], dtype=np.float64)
    outward /= max(float(np.linalg.norm(outward)), 1e-9)
    lean = outward - np.dot(outward, closing) * closing
    z_axis = np.array([0.0, 0.0, -1.0]) + np.tan(tilt_rad) * lean
    z_axis /= np.linalg.norm(z_axis)
    x_axis = np.cross(closing, z_axis)
    return np.column_stack([x_axis, closing, z_axis])
