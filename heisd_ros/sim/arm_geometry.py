"""Geometry of the simulated PIPER: the flange pose and the grasp rotation.

The kinematic constants themselves (modified-DH table for current firmware, joint limits,
gripper range, the link frames and the gripper's tool offsets) live in
``heisd_ros.robot.piper_kinematics``, which takes them from piper_sdk 0.6.2
(``kinematics/piper_fk.py``, ``piper_param/piper_param_manager.py``). One table serves the real
driver and the simulator, so both report the same flange pose for the same joints.
"""

from __future__ import annotations

import numpy as np

from heisd_ros.robot.piper_kinematics import GRIPPER_RANGE_M, JOINT_LIMITS_RAD, PiperKinematics

__all__ = ["GRIPPER_RANGE_M", "JOINT_LIMITS_RAD", "flange_transform", "tool_down_rotation"]

_KINEMATICS = PiperKinematics(dh_is_offset=1)


def flange_transform(q_rad: np.ndarray) -> np.ndarray:
    """4x4 pose of the flange in the base frame (m) at joint angles ``q_rad``."""
    return _KINEMATICS.fk(np.asarray(q_rad, dtype=np.float64))


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
