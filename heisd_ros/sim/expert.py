"""Scripted demonstrator for every task: pick each goal's object and place it, in order.

It outputs the same 7-DoF delta actions a policy would (relative to the env's commanded
pose), with the profile of human demonstrations: minimum-jerk, slightly bowed transits at
up to ~0.18 m/s (<= ~2.5 cm per 10 Hz step), then a slow (<= ~0.5 cm/step) curved approach
into contact. Per-episode randomness (hover height, approach side, speeds) and millimetre
waypoint noise make demonstrations differ. It reads privileged object poses from the env.

Things a conveyor carries are intercepted: a segment towards a moving object (or a moving
target) is planned as if it stood still and then carried along with it, waypoint by
waypoint, by its velocity times the time that waypoint is reached. So the tool arrives where
the object will be, and the approach into contact looks, relative to the object, the same as
on a still table.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from heisd_ros.geometry.rotations import matrix_to_rotvec, matrix_to_rpy
from heisd_ros.robot.piper_kinematics import GRIPPER_RANGE_M, TCP_OFFSET_M
from heisd_ros.sim.arm_geometry import tool_down_rotation
from heisd_ros.sim.env import TOOL_TILT_RAD, PiperSimEnv
from heisd_ros.sim.predicates import goal_satisfied
from heisd_ros.sim.tasks import Goal
from heisd_ros.sim.trajectories import (
    check_head_start,
    curved_approach,
    min_jerk,
    min_jerk_peak_factor,
    slerp_matrices,
    steps_for,
    straight_transit,
)

_TCP_LOCAL = np.array([0.0, 0.0, TCP_OFFSET_M])
#: Transit midpoints stay this far from the base's vertical axis (m).
_MIN_TRANSIT_RADIUS_M = 0.22
#: Lowest TCP height for a grasp (m): keeps the tilted finger tips off the table.
_MIN_GRASP_Z_M = 0.03
#: Below this speed (m/s) a body counts as still: rest jitter is not extrapolated.
_STILL_MPS = 0.005


@dataclass(frozen=True)
class ExpertConfig:
    """Motion parameters of the scripted expert (speeds are peak TCP speeds).

    ``grasp_wait_steps`` / ``release_wait_steps`` hold the tool still after the gripper
    command changes. The sim's fingers close or open within one control step, so the default
    is no hold: the lift or retreat starts at once. A hold is a still state with a still
    label, which a memoryless policy copies forever (the first datasets used 5 and 4).

    ``gripper_lead_steps``: the gripper command changes this many steps before the tool
    arrives. One step is enough: the fingers have closed by the next state, whose label is
    already the lift. With two, the state after the fingers closed still descended, right
    before the lift from almost the same state, and the policy hesitated between the two.
    """

    transit_speed_mps: float = 0.18
    approach_speed_mps: float = 0.06
    rotation_rate_rad_s: float = 1.0
    hover_height_m: float = 0.045
    carry_height_m: float = 0.15
    approach_offset_m: float = 0.03
    waypoint_noise_m: float = 0.0007
    speed_jitter: float = 0.2
    grasp_wait_steps: int = 0
    release_wait_steps: int = 0
    max_grasp_attempts: int = 2
    tool_tilt_rad: float = float(TOOL_TILT_RAD)
    transit_head_start: float = 0.2
    gripper_lead_steps: int = 1

    def __post_init__(self) -> None:
        for name in ("transit_speed_mps", "approach_speed_mps", "rotation_rate_rad_s",
                     "hover_height_m", "carry_height_m"):
            if not getattr(self, name) > 0.0:
                raise ValueError(f"{name}: expected > 0, got {getattr(self, name)}")
        if not 0.0 <= self.speed_jitter < 0.9:
            raise ValueError(f"speed_jitter: expected [0, 0.9), got {self.speed_jitter}")
        for name in ("grasp_wait_steps", "release_wait_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: expected >= 0, got {getattr(self, name)}")
        if self.max_grasp_attempts < 1:
            raise ValueError(f"max_grasp_attempts: expected >= 1, got {self.max_grasp_attempts}")
        check_head_start(self.transit_head_start, "transit_head_start")
        if not 0 <= self.gripper_lead_steps <= 5:
            raise ValueError(f"gripper_lead_steps: expected 0..5, got {self.gripper_lead_steps}")


@dataclass
class _Pose:
    tcp_m: np.ndarray
    rot: np.ndarray
    closed: bool


class ScriptedExpert:
    """Call ``reset()`` after ``env.reset``; then ``act(observation)`` once per step.

    Usable as a policy for ``heisd_ros.sim.runner.run_episodes`` (pass the same ``env``),
    which gives the privileged upper bound for a task.
    """

    def __init__(self, env: PiperSimEnv, config: ExpertConfig | None = None) -> None:
        self.env = env
        self.config = config or ExpertConfig()
        self._rng = np.random.default_rng(0)
        self._script: Iterator[_Pose] = iter(())
        self._last: _Pose | None = None

    def reset(self, seed: int | None = None) -> None:
        """Plan a new episode from the env's current state.

        The expert's noise is seeded by ``seed`` (default: the seed the env was reset with).
        """
        if seed is None:
            seed = self.env.episode_seed if self.env.episode_seed is not None else 0
        self._plan(seed, closed=False, resume=False)

    def take_over(self, seed: int) -> None:
        """Plan the rest of the episode from the current, mid-episode state (DAgger-style).

        For relabelling the states another policy reached: goals that already hold are
        skipped; an object the gripper carries is placed if it is the next goal's; then the
        remaining goals are picked and placed as in a fresh episode (any other held object is
        let go as the transit to the next pick starts, whose waypoints open the gripper).
        The plan starts from the commanded pose and gripper state, as ``reset`` does at an
        episode's start. ``seed`` seeds the expert's noise.
        """
        closed = self.env.gripper_width_command_m < 0.5 * GRIPPER_RANGE_M[1]
        self._plan(seed, closed=closed, resume=True)

    def _plan(self, seed: int, *, closed: bool, resume: bool) -> None:
        """Seed the noise and start the script at the commanded pose."""
        self._rng = np.random.default_rng(seed)
        pos, rot = self.env.commanded_pose
        self._last = _Pose(pos + rot @ _TCP_LOCAL, rot, closed)
        self._script = self._run(resume=resume)

    def act(self, observation=None) -> np.ndarray:
        """The next delta action; holds still with the gripper open once the script ends."""
        if self._last is None:
            raise RuntimeError("ScriptedExpert.act called before reset()")
        self._last = next(self._script, _Pose(self._last.tcp_m, self._last.rot, False))
        cmd_pos, cmd_rot = self.env.commanded_pose
        flange = self._last.tcp_m - self._last.rot @ _TCP_LOCAL
        return np.concatenate([flange - cmd_pos, matrix_to_rpy(self._last.rot @ cmd_rot.T),
                               [1.0 if self._last.closed else 0.0]])

    # ---- the script --------------------------------------------------------------------
    def _run(self, resume: bool = False) -> Iterator[_Pose]:
        task = self.env.task
        goals = list(enumerate(task.goals))
        if resume:
            goals = [(i, g) for i, g in goals if not goal_satisfied(self.env, task, g)]
            held = [o.name for o in task.objects if self._holding(o.name)]
            if goals and goals[0][1].obj in held:  # carrying the next goal's object
                index, goal = goals.pop(0)
                yield from self._place(goal, index)
        for index, goal in goals:
            for _ in range(self.config.max_grasp_attempts):
                yield from self._pick(goal.obj)
                if self._holding(goal.obj):
                    break
                yield from self._release_and_retreat(self._drift_m(goal.obj))
            else:
                return  # grasping failed; the episode will be scored a failure
            yield from self._place(goal, index)

    def _pick(self, name: str) -> Iterator[_Pose]:
        spec, cfg = self.env.task.object(name), self.config
        pos = self.env.body_pos(name)
        drift = self._drift_m(name)  # None on a still table
        rot = self._grasp_rotation(name, pos)
        grasp = np.array([pos[0], pos[1], max(pos[2] + spec.half_height_m - 0.015, _MIN_GRASP_Z_M)])
        hover = self._hover_above(grasp, pos[2] + spec.half_height_m)
        yield from self._move(hover, rot, closed=False, fast=True, drift_m=drift)
        pos = self.env.body_pos(name)  # re-read: closed loop on where the object really is
        grasp[:2] = pos[:2]
        yield from self._move(grasp, rot, closed=False, fast=False,
                              switch_last=cfg.gripper_lead_steps, drift_m=drift)
        yield from self._hold(closed=True, steps=cfg.grasp_wait_steps, drift_m=drift)
        # The lift keeps the belt's pace, so the belt does not drag the block in the fingers.
        lift = self._last.tcp_m.copy()
        lift[2] = cfg.carry_height_m * self._jitter()
        yield from self._move(lift, self._carry_rotation(rot, lift), closed=True, fast=True,
                              curved=False, drift_m=drift)

    def _place(self, goal: Goal, index: int) -> Iterator[_Pose]:
        spec, cfg = self.env.task.object(goal.obj), self.config
        held_offset_z = self._last.tcp_m[2] - self.env.body_pos(goal.obj)[2]
        target_xy, support_z = self._placement(goal, index)
        fixture = self.env.task.fixture(goal.target)
        rot = tool_down_rotation(self._closing_near(target_xy), target_xy, cfg.tool_tilt_rad)
        # Release just above the support; into a basket from a little higher (a short drop
        # is harmless there and keeps the fingers clear of the floor).
        drop_m = 0.02 if fixture is not None and fixture.kind == "basket" else 0.008
        centre_z = support_z + spec.half_height_m + drop_m
        place = np.array([target_xy[0], target_xy[1], centre_z + held_offset_z])
        in_basket = fixture is not None and fixture.kind == "basket"
        clear_z = support_z + (fixture.wall_height_m if in_basket else 0.0)
        # Start the descent once the held object's bottom clears the rim / support.
        hover = self._hover_above(place, clear_z + spec.half_height_m + held_offset_z)
        drift = self._drift_m(goal.target)  # None for a target that stands still
        planned_at = self.env.body_pos(goal.target)
        yield from self._move(hover, rot, closed=True, fast=True, drift_m=drift)
        if drift is not None:  # closed loop: where the moving target really is now
            place[:2] += self.env.body_pos(goal.target)[:2] - planned_at[:2]
        yield from self._move(place, rot, closed=True, fast=False,
                              switch_last=cfg.gripper_lead_steps, drift_m=drift)
        yield from self._release_and_retreat(drift)

    def _release_and_retreat(self, drift_m: np.ndarray | None = None) -> Iterator[_Pose]:
        yield from self._hold(closed=False, steps=self.config.release_wait_steps, drift_m=drift_m)
        # Rising with a moving object keeps the open fingers clear of it.
        up = self._last.tcp_m + np.array([0.0, 0.0, 0.07 * self._jitter()])
        yield from self._move(up, self._last.rot, closed=False, fast=True, curved=False,
                              drift_m=drift_m)

    # ---- segments ----------------------------------------------------------------------
    def _move(self, end_m: np.ndarray, rot: np.ndarray, *, closed: bool, fast: bool,
              curved: bool = True, switch_last: int = 0,
              drift_m: np.ndarray | None = None) -> Iterator[_Pose]:
        """Waypoints to (end_m, rot), the gripper ``closed`` or not.

        ``drift_m`` (m per control step): the segment is planned in the frame of a body that
        moves by that much per step, so waypoint i, reached at the end of step i, is shifted
        by ``(i + 1) * drift_m`` and ``end_m`` is met where the body will be then.

        The last ``switch_last`` waypoints already command the other gripper state: the
        fingers start moving as the tool arrives, so the nearly still states at the end of
        an approach carry the gripper change in their labels, instead of one step that
        looks like its predecessors.
        """
        cfg, start = self.config, self._last
        distance = float(np.linalg.norm(end_m - start.tcp_m))
        angle = float(np.linalg.norm(matrix_to_rotvec(rot @ start.rot.T)))
        speed = (cfg.transit_speed_mps if fast else cfg.approach_speed_mps) * self._jitter()
        head = cfg.transit_head_start
        n = steps_for(distance, angle, speed, cfg.rotation_rate_rad_s,
                      self.env.config.control_rate_hz,
                      min_jerk_peak_factor(head) if fast else 2.0)
        if fast:
            bow = np.array([*self._rng.normal(0.0, 0.01, 2), 0.02 if curved else 0.0])
            bow[:2] += self._around_base(start.tcp_m, end_m)
            path = straight_transit(start.tcp_m, end_m, n, bow, head_start=head)
            rots = slerp_matrices(start.rot, rot, min_jerk(n, head))
        else:
            path = curved_approach(start.tcp_m, end_m, n)
            rots = slerp_matrices(start.rot, rot, np.linspace(1 / n, 1, n))
        path[:-1] += self._rng.normal(0.0, cfg.waypoint_noise_m, path[:-1].shape)
        if drift_m is not None:
            path += np.arange(1, n + 1)[:, None] * drift_m
        switch_from = n - min(switch_last, n - 1)
        for i, (point, r) in enumerate(zip(path, rots, strict=True)):
            yield _Pose(point, r, closed != (i >= switch_from))

    @staticmethod
    def _around_base(start_m: np.ndarray, end_m: np.ndarray) -> np.ndarray:
        """Sideways bow (m) that keeps a transit's midpoint >= 0.22 m from the base axis.

        A straight chord between two far-apart table points can pass close to the base,
        where the arm cannot keep the tool down at carry height; people arc around instead.
        """
        mid = 0.5 * (start_m[:2] + end_m[:2])
        radius = float(np.linalg.norm(mid))
        if radius >= _MIN_TRANSIT_RADIUS_M:
            return np.zeros(2)
        direction = mid / radius if radius > 1e-6 else np.array([1.0, 0.0])
        return (_MIN_TRANSIT_RADIUS_M - radius) * direction

    def _hold(self, *, closed: bool, steps: int,
              drift_m: np.ndarray | None = None) -> Iterator[_Pose]:
        """Stay still, or, with ``drift_m``, keep pace with the moving body the tool is at."""
        for _ in range(steps):
            tcp = self._last.tcp_m if drift_m is None else self._last.tcp_m + drift_m
            yield _Pose(tcp, self._last.rot, closed)

    def _drift_m(self, name: str) -> np.ndarray | None:
        """How far (m) body ``name`` moves per control step on a conveyor; None when still.

        Only a scene with a conveyor moves on its own; elsewhere a body stays where it is
        (and a nudged one is re-read, not extrapolated).
        """
        if self.env.task.conveyor is None:
            return None
        velocity = self.env.body_velocity_mps(name)
        velocity[2] = 0.0
        if float(np.linalg.norm(velocity)) < _STILL_MPS:
            return None
        return velocity / self.env.config.control_rate_hz

    # ---- geometry ----------------------------------------------------------------------
    def _hover_above(self, point: np.ndarray, clear_z: float) -> np.ndarray:
        """Where the fine approach starts: above ``point``, offset sideways (curvature)."""
        angle = self._rng.uniform(0.0, 2 * np.pi)
        offset = self.config.approach_offset_m * self._rng.uniform(0.4, 1.0)
        height = clear_z + self.config.hover_height_m * self._jitter()
        return np.array([point[0] + offset * np.cos(angle), point[1] + offset * np.sin(angle),
                         max(height, point[2] + 0.03)])

    def _grasp_rotation(self, name: str, pos: np.ndarray) -> np.ndarray:
        """Flange rotation that grasps ``name`` across its local x axis.

        Of the directions equivalent under the object's symmetry, the fingers close along the
        one nearest the arm's tangential direction, which keeps joint 6 near zero.
        """
        spec = self.env.task.object(name)
        tangential = np.array([-pos[1], pos[0]]) / max(float(np.linalg.norm(pos[:2])), 1e-6)
        if spec.grasp_symmetry_rad <= 0.0:
            closing = tangential
        else:
            x_axis = self.env.body_rot(name)[:2, 0]
            yaw = np.arctan2(x_axis[1], x_axis[0])
            candidates = [yaw + k * spec.grasp_symmetry_rad
                          for k in range(int(round(2 * np.pi / spec.grasp_symmetry_rad)))]
            dirs = [np.array([np.cos(a), np.sin(a)]) for a in candidates]
            closing = max(dirs, key=lambda d: float(d @ tangential))
        return tool_down_rotation(closing, pos[:2], self.config.tool_tilt_rad)

    def _carry_rotation(self, rot: np.ndarray, where_m: np.ndarray) -> np.ndarray:
        """``rot`` tipped so the tool leans fully away from the base at ``where_m``.

        A grasp whose finger axis points at the base cannot lean (the pads must stay
        vertical), and joint 5's +-70 degree limit then makes carry height unreachable. Once
        the object is held the pads may tilt, so lifting tips the tool over by the smallest
        rotation that gives it the full outward lean.
        """
        outward = where_m[:2] / max(float(np.linalg.norm(where_m[:2])), 1e-6)
        want = np.array([*(np.tan(self.config.tool_tilt_rad) * outward), -1.0])
        want /= np.linalg.norm(want)
        have = rot[:, 2]
        axis = np.cross(have, want)
        sin_angle = float(np.linalg.norm(axis))
        if sin_angle < 1e-9:
            return rot
        angle = np.arctan2(sin_angle, float(have @ want))
        k = axis / sin_angle
        skew = np.array([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
        return (np.eye(3) + np.sin(angle) * skew + (1 - np.cos(angle)) * skew @ skew) @ rot

    def _closing_near(self, target_xy: np.ndarray) -> np.ndarray:
        """Tangential closing direction at ``target_xy``, signed like the current one.

        The sign is taken relative to the arm: joint 6 turns the tool relative to the arm's
        plane (joint 1), so keeping that relative sign keeps joint 6 where it is instead of
        swinging it by half a turn.
        """
        here = self._last.tcp_m[:2]
        tangential_here = np.array([-here[1], here[0]]) / max(float(np.linalg.norm(here)), 1e-6)
        sign = 1.0 if float(self._last.rot[:2, 1] @ tangential_here) >= 0.0 else -1.0
        return sign * np.array([-target_xy[1], target_xy[0]]) / np.linalg.norm(target_xy)

    def _placement(self, goal: Goal, index: int) -> tuple[np.ndarray, float]:
        """Target (x, y) of the object's centre and the height of the surface it goes on."""
        target = self.env.body_pos(goal.target)
        fixture = self.env.task.fixture(goal.target)
        noise = self._rng.normal(0.0, 0.004, 2)
        if fixture is None:  # stacking on another object
            bottom = self.env.task.object(goal.target)
            return target[:2] + 0.3 * noise, target[2] + bottom.half_height_m
        same = [i for i, g in enumerate(self.env.task.goals) if g.target == goal.target]
        xy = target[:2] + noise
        if fixture.kind == "basket" and len(same) > 1:
            # Several objects into one basket: spread them along the radial direction, which
            # is perpendicular to the finger axis, so open fingers never hit a wall.
            radial = xy / np.linalg.norm(xy)
            xy = xy + radial * 0.028 * (2 * same.index(index) / (len(same) - 1) - 1)
        return xy, target[2] + fixture.support_height_m

    def _holding(self, name: str) -> bool:
        spec = self.env.task.object(name)
        lifted = self.env.body_pos(name)[2] > spec.half_height_m + 0.03
        return lifted and self.env.touches_gripper(name)

    def _jitter(self) -> float:
        return float(1.0 + self._rng.uniform(-self.config.speed_jitter, self.config.speed_jitter))
