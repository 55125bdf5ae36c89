"""Physical success checks: is an object really on / in its target, released and at rest?

Every check asks the physics, not the script: the object must touch the target (a MuJoCo
contact between their geoms), lie inside the target's footprint at the right height, be
free of the fingers, and be nearly still relative to its target (a plate riding a conveyor
carries what rests on it). So a held object hovering over the plate, an object balanced on
the basket rim, or one falling past it all fail.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from heisd_ros.sim.objects import FixtureSpec, ObjectSpec
from heisd_ros.sim.tasks import Goal, TaskSpec

#: An object moving faster than this (m/s) relative to its target is not "placed" yet.
MAX_REST_SPEED_MPS = 0.05
#: Footprint margin (m): the object's centre must be this far inside the target's edge.
FOOTPRINT_MARGIN_M = 0.01


class SceneQuery(Protocol):
    """What the predicates need from a simulator (``PiperSimEnv`` implements it)."""

    def body_pos(self, name: str) -> np.ndarray:
        """Position (m) of a body."""

    def body_velocity_mps(self, name: str) -> np.ndarray:
        """Linear velocity (m/s) of a body, in the base frame."""

    def bodies_in_contact(self, body_a: str, body_b: str) -> bool:
        """True when the two bodies touch."""

    def touches_gripper(self, body: str) -> bool:
        """True when the body touches a finger or the palm."""


def goal_satisfied(scene: SceneQuery, task: TaskSpec, goal: Goal) -> bool:
    """True when ``goal`` holds in the current physics state."""
    obj = task.object(goal.obj)
    relative = scene.body_velocity_mps(obj.name) - scene.body_velocity_mps(goal.target)
    if scene.touches_gripper(obj.name) or float(np.linalg.norm(relative)) > MAX_REST_SPEED_MPS:
        return False
    if not scene.bodies_in_contact(obj.name, goal.target):
        return False
    fixture = task.fixture(goal.target)
    if fixture is not None:
        return _inside_fixture(scene, obj, fixture)
    return _stacked(scene, obj, task.object(goal.target))


def task_success(scene: SceneQuery, task: TaskSpec) -> bool:
    """True when every goal of ``task`` holds at once."""
    return all(goal_satisfied(scene, task, goal) for goal in task.goals)


def _inside_fixture(scene: SceneQuery, obj: ObjectSpec, fixture: FixtureSpec) -> bool:
    pos = scene.body_pos(obj.name)
    centre = scene.body_pos(fixture.name)
    offset = pos[:2] - centre[:2]
    inner = fixture.radius_m - FOOTPRINT_MARGIN_M
    if fixture.kind == "plate":
        inside = float(np.linalg.norm(offset)) < inner
    else:
        inside = bool(np.all(np.abs(offset) < inner))
    # Resting, not perched: the centre may be at most one object-size above the support
    # (covers a tipped-over can) and, for a basket, below the rim.
    height = pos[2] - centre[2] - fixture.support_height_m
    max_height = max(obj.half_size_m) + 0.01
    if fixture.kind == "basket":
        max_height = min(max_height, fixture.wall_height_m)
    return inside and 0.0 < height < max_height


def _stacked(scene: SceneQuery, top: ObjectSpec, bottom: ObjectSpec) -> bool:
    top_pos, bottom_pos = scene.body_pos(top.name), scene.body_pos(bottom.name)
    offset = np.abs(top_pos[:2] - bottom_pos[:2])
    inside = bool(np.all(offset < max(min(bottom.half_size_m[:2]), 0.012)))
    expected_gap = bottom.half_height_m + top.half_height_m
    gap = top_pos[2] - bottom_pos[2]
    # The bottom object must itself rest on the table (not be lifted along with the top one).
    bottom_resting = bottom_pos[2] < bottom.half_height_m + 0.01
    return inside and bottom_resting and abs(gap - expected_gap) < 0.012
