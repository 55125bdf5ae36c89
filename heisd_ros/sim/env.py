"""The simulated PIPER tabletop: reset to a seeded task layout, step 7-DoF EE delta commands.

Control path, as on the real arm: delta command -> per-step clamp -> absolute target pose
(relative to the previous *commanded* pose) -> workspace clamp -> IK -> joint position
targets, ramped over the first part of the control period and then held. The commanded pose
is re-read from the IK solution, so an unreachable target never winds up.

Action layout (``heisd_ros.data.observation.ACTION_DIM_NAMES``): dx, dy, dz in metres and
droll, dpitch, dyaw in radians about the fixed base axes (``R_target = R(drpy) @ R_cmd``),
all in the base frame; gripper >= 0.5 means closed, else open (EECommand's GRIPPER_CLOSED=1).
Closing drives the fingers towards zero width with a capped force; what holds an object is
contact friction (no weld or attachment constraint).
"""

from __future__ import annotations

from dataclasses import dataclass

import mujoco
import numpy as np

from heisd_ros.data.episode import make_proprio
from heisd_ros.data.observation import Observation, check_action
from heisd_ros.geometry.rotations import (
    matrix_to_quat_wxyz,
    matrix_to_quat_xyzw,
    matrix_to_rpy,
    rot_z,
    rpy_to_matrix,
)
from heisd_ros.robot.base import RobotState
from heisd_ros.sim.arm_geometry import GRIPPER_RANGE_M, tool_down_rotation
from heisd_ros.sim.config import SimConfig
from heisd_ros.sim.conveyor import ConveyorDrive
from heisd_ros.sim.ik import FlangeIK
from heisd_ros.sim.predicates import task_success
from heisd_ros.sim.rendering import CameraRig
from heisd_ros.sim.scene_mjcf import build_scene_xml
from heisd_ros.sim.tasks import TaskSpec

GRIPPER_CLOSED_THRESHOLD = 0.5
#: Start pose of the flange (base frame, m) and the tool's lean away from the base (rad).
READY_FLANGE_POS_M = np.array([0.22, 0.0, 0.27])
TOOL_TILT_RAD = np.deg2rad(20.0)
_READY_Q_SEED_RAD = np.array([0.0, 1.4, -1.1, 0.0, 1.0, 0.0])
_SETTLE_S = 0.3


#: IK residuals above these mean the target was out of reach (joint limits or arm length).
UNREACHED_POSITION_M = 0.002
UNREACHED_ROTATION_RAD = 0.02


@dataclass(frozen=True)
class StepResult:
    """What one control step returns: the new observation and robot state, and success.

    ``limits`` names every limit that changed the command in this step ("step translation",
    "step rotation", "workspace", "unreachable"), each with the numbers, so a caller can
    report it; an empty tuple means the command was executed as given.
    """

    observation: Observation
    state: RobotState
    success: bool
    limits: tuple[str, ...] = ()


class PiperSimEnv:
    """MuJoCo PIPER with one task's scene. Build once per task; ``reset(seed)`` per episode."""

    def __init__(self, task: TaskSpec, config: SimConfig | None = None) -> None:
        self.task = task
        self.config = config or SimConfig()
        cfg = self.config
        self.model = mujoco.MjModel.from_xml_string(build_scene_xml(
            task.objects, task.fixtures, image_width_px=cfg.image_width_px,
            image_height_px=cfg.image_height_px, third_person_fovy_deg=cfg.third_person_fovy_deg,
            wrist_fovy_deg=cfg.wrist_fovy_deg, physics_timestep_s=cfg.physics_timestep_s,
            conveyor=task.conveyor))
        self.data = mujoco.MjData(self.model)
        self._conveyor = (ConveyorDrive(self.model, task.conveyor)
                          if task.conveyor is not None else None)
        self._ik = FlangeIK(self.model)
        self._cameras = CameraRig(self.model, cfg.image_width_px, cfg.image_height_px,
                                  enabled=cfg.render)
        self._flange = self._id(mujoco.mjtObj.mjOBJ_SITE, "flange")
        self._tcp = self._id(mujoco.mjtObj.mjOBJ_SITE, "tcp")
        self._finger_qpos = [self.model.jnt_qposadr[self._id(mujoco.mjtObj.mjOBJ_JOINT, n)]
                             for n in ("finger_left", "finger_right")]
        self._gripper_bodies = {self._id(mujoco.mjtObj.mjOBJ_BODY, n)
                                for n in ("finger_left", "finger_right", "link6")}
        self._q_target = _READY_Q_SEED_RAD.copy()
        # The joint ramp towards _q_target: from _q_from over _ramp_steps physics steps, of
        # which _ramp_done have run (then the target is held).
        self._q_from = self._q_target.copy()
        self._ramp_steps = self._ramp_done = 1
        self._cmd_pos = np.zeros(3)
        self._cmd_rot = np.eye(3)
        self._gripper_width_cmd = GRIPPER_RANGE_M[1]
        self.step_index = 0
        self.episode_seed: int | None = None

    # ---- episode control -------------------------------------------------------------
    def reset(self, seed: int) -> Observation:
        """Place the task's bodies from ``seed``, put the arm at its jittered start pose."""
        rng = np.random.default_rng(seed)
        self.episode_seed = int(seed)
        mujoco.mj_resetData(self.model, self.data)
        layout = self.task.layout(rng)
        belt = self._conveyor
        if belt is not None:  # its speed is drawn after the layout, before the arm's jitter
            belt.reset(self.data, layout, rng)
        for spec in self.task.objects:
            x, y, yaw = layout[spec.name]
            joint = self.model.body_jntadr[self._body(spec.name)]
            adr, dof = self.model.jnt_qposadr[joint], self.model.jnt_dofadr[joint]
            z = spec.half_height_m + 0.001
            if belt is not None and belt.carries(x, y):
                # On the belt, and already moving with it: no slip at the start.
                z += belt.spec.thickness_m
                self.data.qvel[dof + 1] = belt.speed_m_per_s
            self.data.qpos[adr:adr + 3] = (x, y, z)
            self.data.qpos[adr + 3:adr + 7] = _quat_wxyz_from_yaw(yaw)
        mounted = belt.spec.mounted if belt is not None else ()
        for spec in self.task.fixtures:
            if spec.name in mounted:  # rides the belt: placed by the belt's start
                continue
            x, y, yaw = layout[spec.name]
            mocap = self.model.body_mocapid[self._body(spec.name)]
            self.data.mocap_pos[mocap] = (x, y, 0.0)
            self.data.mocap_quat[mocap] = _quat_wxyz_from_yaw(yaw)
        start = READY_FLANGE_POS_M + rng.uniform(-1, 1, 3) * self.config.initial_pose_jitter_m
        rot = tool_down_rotation((0.0, 1.0), (1.0, 0.0), TOOL_TILT_RAD)
        q = self._ik.solve(start, rot, _READY_Q_SEED_RAD).q_rad
        self.data.qpos[:6] = q
        self._q_target, self._q_from = q.copy(), q.copy()
        self._ramp_steps = self._ramp_done = 1
        self._cmd_pos, self._cmd_rot = self._ik.forward(q)
        self._gripper_width_cmd = GRIPPER_RANGE_M[1]
        self._apply_ctrl(q, self._gripper_width_cmd)
        mujoco.mj_forward(self.model, self.data)
        mujoco.mj_step(self.model, self.data, nstep=int(_SETTLE_S / self.config.physics_timestep_s))
        self.step_index = 0
        return self.observe()

    def step(self, action: np.ndarray) -> StepResult:
        """Execute one 7-DoF delta command for one control period."""
        target_pos, target_rot, width, limits = self._delta_target(action)
        return self._execute(target_pos, target_rot, width, limits)

    def command_delta(self, action: np.ndarray) -> tuple[str, ...]:
        """Take one 7-DoF delta command as the new target without running physics (real time).

        The delta is relative to the commanded pose, as in :meth:`step`; :meth:`advance` then
        moves the arm. Returns the limits that changed it.
        """
        return self._command(*self._delta_target(action))

    def _delta_target(self, action: np.ndarray):
        """(target position, target rotation, gripper width, limits) of a delta command."""
        cfg = self.config
        act = check_action(action)  # NaN/inf or a wrong shape raise here, naming the problem
        d_pos = np.clip(act[:3], -cfg.max_step_translation_m, cfg.max_step_translation_m)
        d_rot = np.clip(act[3:6], -cfg.max_step_rotation_rad, cfg.max_step_rotation_rad)
        limits = []
        if np.any(d_pos != act[:3]):
            limits.append(f"step translation: {np.round(act[:3], 4).tolist()} m clamped to "
                          f"+-{cfg.max_step_translation_m} m per axis")
        if np.any(d_rot != act[3:6]):
            limits.append(f"step rotation: {np.round(act[3:6], 4).tolist()} rad clamped to "
                          f"+-{cfg.max_step_rotation_rad} rad per axis")
        width = 0.0 if act[6] >= GRIPPER_CLOSED_THRESHOLD else GRIPPER_RANGE_M[1]
        return self._cmd_pos + d_pos, rpy_to_matrix(d_rot) @ self._cmd_rot, width, limits

    def move_to(self, position_m: np.ndarray, rpy_rad: np.ndarray,
                gripper_width_m: float | None = None) -> StepResult:
        """Execute one absolute flange target (base frame) for one control period.

        The seam for a ``heisd_ros.robot.Robot`` adapter, whose safety filter already made
        the target absolute. ``gripper_width_m=None`` leaves the gripper as it is.
        """
        width = self._gripper_width_cmd if gripper_width_m is None else float(gripper_width_m)
        return self._execute(np.asarray(position_m, float), rpy_to_matrix(rpy_rad), width)

    def command(self, position_m: np.ndarray, rpy_rad: np.ndarray,
                gripper_width_m: float | None = None) -> tuple[str, ...]:
        """Take an absolute flange target (base frame) without running physics (real time).

        The joints ramp to it from where they are being driven now over the same share of a
        control period as in :meth:`move_to`, while :meth:`advance` runs; a newer target
        replaces it mid-ramp. Returns the limits that changed it (see ``StepResult.limits``).
        """
        width = self._gripper_width_cmd if gripper_width_m is None else float(gripper_width_m)
        return self._command(np.asarray(position_m, float), rpy_to_matrix(rpy_rad), width)

    def advance(self, substeps: int) -> None:
        """Run ``substeps`` physics steps towards the current target (real time).

        On the ramp the servo targets change every step; once it is done they hold, and the
        rest runs in one ``mj_step(nstep=...)``: the same physics, bit for bit, with the GIL
        released once instead of once a step (a step that waits for the GIL behind a busy
        executor thread costs up to the interpreter's 5 ms switch interval).
        """
        left = int(substeps)
        while left > 0 and self._ramp_done + 1 < self._ramp_steps:
            self._ramp_done += 1
            alpha = self._ramp_done / self._ramp_steps
            self._apply_ctrl(self._q_from + alpha * (self._q_target - self._q_from),
                             self._gripper_width_cmd)
            mujoco.mj_step(self.model, self.data)
            left -= 1
        if left > 0:
            self._ramp_done += left
            self._apply_ctrl(self._q_from + (self._q_target - self._q_from),
                             self._gripper_width_cmd)  # alpha 1, as on the ramp
            mujoco.mj_step(self.model, self.data, nstep=left)

    def _execute(self, target_pos: np.ndarray, target_rot: np.ndarray,
                 width_m: float, limits: list[str] | None = None) -> StepResult:
        limits = self._command(target_pos, target_rot, width_m, limits)
        self.advance(self.config.substeps)
        self.step_index += 1
        return StepResult(self.observe(), self.robot_state(), self.success(), limits)

    def _command(self, target_pos: np.ndarray, target_rot: np.ndarray,
                 width_m: float, limits: list[str] | None = None) -> tuple[str, ...]:
        """Solve and take a target: the new ramp starts where the joints are driven now."""
        cfg = self.config
        limits = list(limits or ())
        wanted = np.asarray(target_pos, float)
        target_pos = np.clip(wanted, cfg.workspace_min_m, cfg.workspace_max_m)
        if np.any(target_pos != wanted):
            limits.append(f"workspace: flange target {np.round(wanted, 4).tolist()} m clamped "
                          f"to {np.round(target_pos, 4).tolist()} m")
        solution = self._ik.solve(target_pos, target_rot, self._q_target)
        q_new = solution.q_rad
        if (solution.position_error_m > UNREACHED_POSITION_M
                or solution.rotation_error_rad > UNREACHED_ROTATION_RAD):
            limits.append(f"unreachable: the nearest pose within the joint limits is "
                          f"{solution.position_error_m * 1e3:.1f} mm / "
                          f"{solution.rotation_error_rad:.3f} rad from the target")
        # The commanded pose is what the arm can reach: no wind-up against a wall or a limit.
        self._cmd_pos, self._cmd_rot = self._ik.forward(q_new)
        self._gripper_width_cmd = float(np.clip(width_m, *GRIPPER_RANGE_M))
        # A finished ramp starts from its target exactly, so lockstep steps are unchanged.
        self._q_from = self._joint_drive()
        self._q_target = q_new
        self._ramp_steps = max(1, int(round(cfg.substeps * (1.0 - cfg.settle_fraction))))
        self._ramp_done = 0
        return tuple(limits)

    def _joint_drive(self) -> np.ndarray:
        """The joint targets the servos are driven to now (on the ramp, or its end)."""
        if self._ramp_done >= self._ramp_steps:
            return self._q_target
        alpha = self._ramp_done / self._ramp_steps
        return self._q_from + alpha * (self._q_target - self._q_from)

    def observe(self) -> Observation:
        """Both camera images, the instruction and proprio [ee_pos_m, ee_rpy_rad, width_m]."""
        third, wrist = self._cameras.render(self.data)
        state = self.robot_state()
        return Observation(image_primary=third, image_wrist=wrist,
                           instruction=self.task.instruction,
                           proprio=make_proprio(state.ee_position_m, state.ee_rpy_rad,
                                                state.gripper_width_m),
                           stamp_s=state.stamp_s,
                           extras={"joint_positions_rad": state.joint_positions_rad,
                                   "ee_quat_xyzw": self.ee_quat_xyzw()})

    def render_camera(self, name: str) -> np.ndarray:
        """One camera's image ("third_person" or "wrist") of the current state (real time)."""
        return self._cameras.render_camera(self.data, name)

    def robot_state(self) -> RobotState:
        """Measured state in the units and record the real driver reports."""
        return RobotState(stamp_s=float(self.data.time),
                          joint_positions_rad=self.data.qpos[:6].copy(),
                          gripper_width_m=float(sum(self.data.qpos[i] for i in self._finger_qpos)),
                          ee_position_m=self.data.site_xpos[self._flange].copy(),
                          ee_rpy_rad=matrix_to_rpy(self.data.site_xmat[self._flange].reshape(3, 3)),
                          motors_enabled=(True,) * 6, gripper_enabled=True)

    def ee_quat_xyzw(self) -> np.ndarray:
        """Flange orientation as a unit quaternion (x, y, z, w)."""
        return matrix_to_quat_xyzw(self.data.site_xmat[self._flange].reshape(3, 3))

    def success(self) -> bool:
        """True when the task's goals all hold in the current physics state."""
        return task_success(self, self.task)

    # ---- privileged state (experts, predicates, tests) ---------------------------------
    @property
    def commanded_pose(self) -> tuple[np.ndarray, np.ndarray]:
        """Commanded flange position (m) and rotation matrix: what deltas are relative to."""
        return self._cmd_pos.copy(), self._cmd_rot.copy()

    @property
    def gripper_width_command_m(self) -> float:
        """The commanded finger opening (m)."""
        return self._gripper_width_cmd

    def tcp_pos(self) -> np.ndarray:
        """Tool centre point (between the finger pads) in the base frame (m)."""
        return self.data.site_xpos[self._tcp].copy()

    def body_pos(self, name: str) -> np.ndarray:
        """Position (m) of body ``name``."""
        return self.data.xpos[self._body(name)].copy()

    def body_rot(self, name: str) -> np.ndarray:
        """Rotation matrix of body ``name``."""
        return self.data.xmat[self._body(name)].reshape(3, 3).copy()

    @property
    def conveyor_speed_m_per_s(self) -> float:
        """This episode's belt speed along +y (m/s); 0 without a conveyor."""
        return self._conveyor.speed_m_per_s if self._conveyor is not None else 0.0

    def body_velocity_mps(self, name: str) -> np.ndarray:
        """Linear velocity (m/s, base frame) of body ``name``, also one carried by another.

        A free body's is its joint velocity; any other body's (a fixture riding the belt, a
        mocap body: zero) is its frame's velocity from the kinematic tree.
        """
        body = self._body(name)
        if self.model.body_jntnum[body] > 0 and self.model.jnt_type[
                self.model.body_jntadr[body]] == mujoco.mjtJoint.mjJNT_FREE:
            dof = self.model.jnt_dofadr[self.model.body_jntadr[body]]
            return self.data.qvel[dof:dof + 3].copy()
        twist = np.zeros(6)
        mujoco.mj_objectVelocity(self.model, self.data, mujoco.mjtObj.mjOBJ_XBODY, body, twist, 0)
        return twist[3:].copy()

    def body_speed_mps(self, name: str) -> float:
        """Linear speed (m/s) of body ``name``; 0 for bodies without a joint."""
        body = self._body(name)
        if self.model.body_jntnum[body] == 0:
            return 0.0
        dof = self.model.jnt_dofadr[self.model.body_jntadr[body]]
        return float(np.linalg.norm(self.data.qvel[dof:dof + 3]))

    def bodies_in_contact(self, body_a: str, body_b: str) -> bool:
        """True when any geom of ``body_a`` touches any geom of ``body_b``."""
        b1, b2 = self._contact_bodies()
        a, b = self._body(body_a), self._body(body_b)
        return bool(np.any(((b1 == a) & (b2 == b)) | ((b1 == b) & (b2 == a))))

    def touches_gripper(self, body: str) -> bool:
        """True when ``body`` touches a finger or the palm."""
        b1, b2 = self._contact_bodies()
        target = self._body(body)
        gripper = list(self._gripper_bodies)
        return bool(np.any(((b1 == target) & np.isin(b2, gripper))
                           | ((b2 == target) & np.isin(b1, gripper))))

    def close(self) -> None:
        """Release the renderer (its GL context)."""
        self._cameras.close()

    def __enter__(self) -> PiperSimEnv:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- internals ---------------------------------------------------------------------
    def _apply_ctrl(self, q_rad: np.ndarray, width_m: float) -> None:
        self.data.ctrl[:6] = q_rad
        self.data.ctrl[6] = width_m / 2.0  # the servo drives one finger; the other mirrors it

    def _contact_bodies(self) -> tuple[np.ndarray, np.ndarray]:
        """Body ids of both sides of every active contact."""
        n = self.data.ncon
        return (self.model.geom_bodyid[self.data.contact.geom1[:n]],
                self.model.geom_bodyid[self.data.contact.geom2[:n]])

    def _body(self, name: str) -> int:
        return self._id(mujoco.mjtObj.mjOBJ_BODY, name)

    def _id(self, kind: mujoco.mjtObj, name: str) -> int:
        index = mujoco.mj_name2id(self.model, kind, name)
        if index < 0:
            raise ValueError(f"name: no {kind.name[6:].lower()} {name!r} in the scene of task "
                             f"{self.task.name!r}")
        return index


def _quat_wxyz_from_yaw(yaw_rad: float) -> np.ndarray:
    return matrix_to_quat_wxyz(rot_z(yaw_rad))
