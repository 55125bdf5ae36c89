"""How far a closed-loop episode got with each goal object: reached, grasped, lifted.

A success rate of zero says nothing about where a policy fails; these stages do. For every
goal of the task (in order) the tracker records whether the gripper ever

- **reached** the object: TCP within ``reach_xy_m`` of it horizontally and no higher than
  ``reach_above_m`` above its centre;
- **grasped** it: the object touches a finger while the gripper command is closed;
- **lifted** it: the object rose ``lift_m`` above where it started, while grasped.

The stages are read from the simulator's state after every step (privileged information: an
evaluation aid, never a policy input); the lift is measured from the object's height after the
first step. ``heisd_ros.eval.metrics.first_goal_progress`` summarises them over episodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from heisd_ros.sim.env import GRIPPER_CLOSED_THRESHOLD, PiperSimEnv

STAGES = ("reached", "grasped", "lifted")


@dataclass(frozen=True)
class ProgressConfig:
    """Thresholds of the stages (m)."""

    reach_xy_m: float = 0.01
    reach_above_m: float = 0.03
    lift_m: float = 0.03


class EpisodeProgress:
    """Call :meth:`update` after every step of an episode; :meth:`result` at the end."""

    def __init__(self, env: PiperSimEnv, config: ProgressConfig | None = None) -> None:
        self.env, self.config = env, config or ProgressConfig()
        self.objects = list(dict.fromkeys(goal.obj for goal in env.task.goals))
        self.start_z = {name: float(env.body_pos(name)[2]) for name in self.objects}
        self.stages = {name: dict.fromkeys(STAGES, False) for name in self.objects}

    def update(self, action: np.ndarray) -> None:
        """Fold in the state after a step that executed ``action``."""
        cfg, tcp = self.config, self.env.tcp_pos()
        closed = float(action[6]) >= GRIPPER_CLOSED_THRESHOLD
        for name, stage in self.stages.items():
            pos = self.env.body_pos(name)
            if (np.linalg.norm(tcp[:2] - pos[:2]) < cfg.reach_xy_m
                    and tcp[2] < pos[2] + cfg.reach_above_m):
                stage["reached"] = True
            held = closed and self.env.touches_gripper(name)
            stage["grasped"] |= held
            stage["lifted"] |= held and pos[2] > self.start_z[name] + cfg.lift_m

    def result(self) -> dict[str, dict[str, bool]]:
        """{goal object: {stage: bool}} in goal order."""
        return {name: dict(stage) for name, stage in self.stages.items()}
