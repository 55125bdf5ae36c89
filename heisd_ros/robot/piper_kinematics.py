"""PIPER forward kinematics, geometric Jacobian and a damped-least-squares IK step.

The Denavit-Hartenberg table (modified/Craig convention, ``T = RotX(alpha) TransX(a) RotZ(theta)
TransZ(d)``) is piper_sdk 0.6.2's ``kinematics/piper_fk.py`` (``C_PiperForwardKinematics``), in
metres here; ``dh_is_offset=1`` is current firmware (joints 2 and 3 offset by 2 degrees). The
flange frame (joint 6) is what the arm reports as its end pose on 0x2A2-0x2A4.

The same table places the links of the simulator's MJCF and of the URDF
(:func:`dh_fixed_transforms`), so the driver, the simulator and the viewer agree on the flange
pose for the same joints.
"""

from __future__ import annotations

import math

import numpy as np

from heisd_ros.geometry.rotations import matrix_to_rotvec

#: Joint limits in rad, from piper_sdk's ``piper_param_manager.PIPER_PARAM`` (j1..j6).
JOINT_LIMITS_RAD = np.array(
    [
        [-2.6179, 2.6179],
        [0.0, 3.14],
        [-2.967, 0.0],
        [-1.745, 1.745],
        [-1.22, 1.22],
        [-2.09439, 2.09439],
    ]
)

#: Gripper opening range in metres, from the same table (``gripper_range``).
GRIPPER_RANGE_M = (0.0, 0.07)

#: Arm joint names, base to flange, as the driver and the simulator publish them.
JOINT_NAMES: tuple[str, ...] = ("joint1", "joint2", "joint3", "joint4", "joint5", "joint6")

# Simplified gripper on the flange (flange z axis points out of the tool), shared by the
# simulator's model and the URDF's visuals.
#: Tool centre point, between the finger pads, this far along flange z (m).
TCP_OFFSET_M = 0.13
#: Finger tips are this far along flange z (m).
FINGER_TIP_OFFSET_M = 0.15

_A_M = np.array([0.0, 0.0, 0.28503, -0.02198, 0.0, 0.0])
_ALPHA = np.array([0.0, -math.pi / 2, 0.0, math.pi / 2, -math.pi / 2, math.pi / 2])
_D_M = np.array([0.123, 0.0, 0.0, 0.25075, 0.0, 0.091])
_THETA_OFFSET = {
    0: np.radians([0.0, -174.22, -100.78, 0.0, 0.0, 0.0]),
    1: np.radians([0.0, -172.22, -102.78, 0.0, 0.0, 0.0]),
}


class PiperKinematics:
    """FK / Jacobian / IK of the 6-DoF PIPER arm (flange frame, metres and radians)."""

    def __init__(self, dh_is_offset: int = 1) -> None:
        if dh_is_offset not in _THETA_OFFSET:
            raise ValueError(f"dh_is_offset: expected 0 or 1, got {dh_is_offset!r}")
        self._theta_offset = _THETA_OFFSET[dh_is_offset]
        self._calpha = np.cos(_ALPHA)
        self._salpha = np.sin(_ALPHA)

    def frames(self, joints_rad: np.ndarray) -> np.ndarray:
        """(6, 4, 4) base->frame i transforms for i = 1..6 (frame i rotates about its own z)."""
        theta = np.asarray(joints_rad, dtype=np.float64) + self._theta_offset
        ct, st = np.cos(theta), np.sin(theta)
        ca, sa = self._calpha, self._salpha
        links = np.zeros((6, 4, 4))
        links[:, 0, 0], links[:, 0, 1], links[:, 0, 3] = ct, -st, _A_M
        links[:, 1, 0], links[:, 1, 1], links[:, 1, 2], links[:, 1, 3] = (
            st * ca,
            ct * ca,
            -sa,
            -sa * _D_M,
        )
        links[:, 2, 0], links[:, 2, 1], links[:, 2, 2], links[:, 2, 3] = (
            st * sa,
            ct * sa,
            ca,
            ca * _D_M,
        )
        links[:, 3, 3] = 1.0
        out = np.empty_like(links)
        out[0] = links[0]
        for i in range(1, 6):
            out[i] = out[i - 1] @ links[i]
        return out

    def fk(self, joints_rad: np.ndarray) -> np.ndarray:
        """(4, 4) base->flange transform."""
        return self.frames(joints_rad)[5]

    def jacobian(self, joints_rad: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Geometric Jacobian (6, 6) [linear; angular] in the base frame, and the flange pose."""
        frames = self.frames(joints_rad)
        z = frames[:, :3, 2]
        p = frames[:, :3, 3]
        jac = np.empty((6, 6))
        jac[:3] = np.cross(z, p[5] - p).T
        jac[3:] = z.T
        return jac, frames[5]

    def ik_step(
        self,
        joints_rad: np.ndarray,
        target: np.ndarray,
        iterations: int = 3,
        damping: float = 0.02,
        max_joint_step_rad: float = 0.2,
    ) -> tuple[np.ndarray, float]:
        """A few damped-least-squares iterations toward a (4, 4) flange target.

        Returns the new joints (clipped to :data:`JOINT_LIMITS_RAD`) and the remaining error
        ``|dp| + 0.1 m/rad * |drot|`` in metres. Warm-start from the previous solution.
        """
        q = np.array(joints_rad, dtype=np.float64)
        err_norm = math.inf
        for _ in range(iterations):
            jac, pose = self.jacobian(q)
            err = np.concatenate(
                [target[:3, 3] - pose[:3, 3], matrix_to_rotvec(target[:3, :3] @ pose[:3, :3].T)]
            )
            err_norm = float(np.linalg.norm(err[:3]) + 0.1 * np.linalg.norm(err[3:]))
            if err_norm < 1e-7:
                break
            dq = jac.T @ np.linalg.solve(jac @ jac.T + damping**2 * np.eye(6), err)
            step = float(np.max(np.abs(dq)))
            if step > max_joint_step_rad:
                dq *= max_joint_step_rad / step
            q = np.clip(q + dq, JOINT_LIMITS_RAD[:, 0], JOINT_LIMITS_RAD[:, 1])
        else:
            pose = self.fk(q)
            err_norm = float(
                np.linalg.norm(target[:3, 3] - pose[:3, 3])
                + 0.1 * np.linalg.norm(matrix_to_rotvec(target[:3, :3] @ pose[:3, :3].T))
            )
        return q, err_norm


def dh_fixed_transforms() -> list[np.ndarray]:
    """The constant part of each link's transform in its parent frame (six 4x4 arrays).

    In the modified-DH product ``RotX(alpha) TransX(a) RotZ(theta0 + q) TransZ(d)`` the
    factors RotZ(q) and TransZ(d) commute, so each link is a fixed transform followed by a
    rotation about its own z axis: exactly a MuJoCo body (or URDF joint) with a hinge on z at
    its origin. With all joints at 0 the chain's successive frames give those fixed transforms
    (current firmware, ``dh_is_offset=1``).
    """
    frames = PiperKinematics(dh_is_offset=1).frames(np.zeros(6))
    out = [frames[0]]
    for i in range(1, 6):
        out.append(np.linalg.inv(frames[i - 1]) @ frames[i])
    return out
