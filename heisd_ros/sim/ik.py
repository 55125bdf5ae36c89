"""Damped-least-squares inverse kinematics for the flange, on MuJoCo's site Jacobian.

Runs on a private ``MjData`` so solving never disturbs the simulation state. Only the six
arm joints move; results are clamped to the real arm's joint limits at every iteration, so
an unreachable target yields the closest reachable configuration (never an exception): the
caller reads back the achieved pose and uses that as its new commanded pose.
"""

from __future__ import annotations

from dataclasses import dataclass

import mujoco
import numpy as np

from heisd_ros.geometry.rotations import matrix_to_rotvec
from heisd_ros.sim.arm_geometry import JOINT_LIMITS_RAD


@dataclass(frozen=True)
class IKConfig:
    """Solver settings.

    Attributes:
        max_iterations: Gauss-Newton iterations per solve.
        damping: DLS damping lambda (m-equivalent); larger = steadier near singularities.
        tolerance_m: stop when the position error is below this and ...
        tolerance_rad: ... the orientation error is below this.
        rotation_weight_m_per_rad: how many metres of position error one radian of
            orientation error counts as (0.1 = a 10 cm lever).
        max_joint_step_rad: per-iteration cap on any joint change, keeps iterations local.
    """

    max_iterations: int = 40
    damping: float = 0.02
    tolerance_m: float = 1e-4
    tolerance_rad: float = 1e-3
    rotation_weight_m_per_rad: float = 0.15
    max_joint_step_rad: float = 0.2

    def __post_init__(self) -> None:
        if self.max_iterations < 1:
            raise ValueError(f"max_iterations: expected >= 1, got {self.max_iterations}")
        for name in ("damping", "tolerance_m", "tolerance_rad", "rotation_weight_m_per_rad",
                     "max_joint_step_rad"):
            if not getattr(self, name) > 0.0:
                raise ValueError(f"{name}: expected > 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class IKResult:
    """Joint solution and the residual pose error it leaves (m, rad)."""

    q_rad: np.ndarray
    position_error_m: float
    rotation_error_rad: float
    iterations: int


class FlangeIK:
    """Solve joint angles for a flange pose, on a model whose first 6 dofs are the arm."""

    def __init__(self, model: mujoco.MjModel, site_name: str = "flange",
                 config: IKConfig | None = None) -> None:
        self._model = model
        self._data = mujoco.MjData(model)
        self._site = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, site_name)
        if self._site < 0:
            raise ValueError(f"site_name: no site {site_name!r} in the model")
        self._config = config or IKConfig()
        self._jacp = np.zeros((3, model.nv))
        self._jacr = np.zeros((3, model.nv))

    def forward(self, q_rad: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Flange position (m) and rotation matrix at arm joints ``q_rad``."""
        self._data.qpos[:6] = q_rad
        mujoco.mj_kinematics(self._model, self._data)
        return (self._data.site_xpos[self._site].copy(),
                self._data.site_xmat[self._site].reshape(3, 3).copy())

    def solve(self, target_pos_m: np.ndarray, target_rot: np.ndarray,
              q_init_rad: np.ndarray) -> IKResult:
        """Iterate from ``q_init_rad`` towards the target pose (base frame, m / rotation matrix)."""
        cfg = self._config
        q = np.clip(np.asarray(q_init_rad, float).copy(), JOINT_LIMITS_RAD[:, 0],
                    JOINT_LIMITS_RAD[:, 1])
        w = cfg.rotation_weight_m_per_rad
        pos_err = rot_err = np.inf
        iterations = 0
        for iterations in range(1, cfg.max_iterations + 1):  # noqa: B007 (reported below)
            pos, rot = self.forward(q)
            e_pos = target_pos_m - pos
            # Orientation error in the base frame: the rotation taking current to target.
            e_rot = matrix_to_rotvec(target_rot @ rot.T)
            pos_err, rot_err = float(np.linalg.norm(e_pos)), float(np.linalg.norm(e_rot))
            if pos_err < cfg.tolerance_m and rot_err < cfg.tolerance_rad:
                break
            mujoco.mj_comPos(self._model, self._data)
            mujoco.mj_jacSite(self._model, self._data, self._jacp, self._jacr, self._site)
            # Weighted 6xN Jacobian; rows scaled so position and orientation errors compare.
            jac = np.vstack([self._jacp[:, :6], w * self._jacr[:, :6]])
            err = np.concatenate([e_pos, w * e_rot])
            dq = jac.T @ np.linalg.solve(jac @ jac.T + cfg.damping ** 2 * np.eye(6), err)
            dq = np.clip(dq, -cfg.max_joint_step_rad, cfg.max_joint_step_rad)
            q = np.clip(q + dq, JOINT_LIMITS_RAD[:, 0], JOINT_LIMITS_RAD[:, 1])
        pos, rot = self.forward(q)
        pos_err = float(np.linalg.norm(target_pos_m - pos))
        rot_err = float(np.linalg.norm(matrix_to_rotvec(target_rot @ rot.T)))
        return IKResult(q, pos_err, rot_err, iterations)
