"""Task descriptions: what is on the table, where it starts, and what counts as success.

A task is data (objects, receptacles, a layout sampler, goals); the physics checks live in
``predicates`` and the scripted demonstrator in ``expert``. Goals are ordered: a two-stage
task lists two, the expert does them in order, and success needs all of them at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from heisd_ros.sim.conveyor import ConveyorSpec
from heisd_ros.sim.objects import FixtureSpec, ObjectSpec

RELATIONS = ("on", "in")

#: A layout sampler: seeded RNG -> {body name: (x_m, y_m, yaw_rad)} for every object and fixture.
LayoutSampler = Callable[[np.random.Generator], Mapping[str, tuple[float, float, float]]]


@dataclass(frozen=True)
class Goal:
    """``obj`` must end ``relation`` ("on" or "in") ``target`` (a fixture or another object)."""

    obj: str
    relation: str
    target: str

    def __post_init__(self) -> None:
        if self.relation not in RELATIONS:
            raise ValueError(f"relation: expected one of {RELATIONS}, got {self.relation!r}")
        if self.obj == self.target:
            raise ValueError(f"target: an object cannot be placed on itself ({self.obj!r})")


@dataclass(frozen=True)
class TaskSpec:
    """One task of a suite.

    Attributes:
        name: task name, unique within its suite.
        suite: suite name.
        instruction: the natural-language instruction the policy receives.
        objects: graspable objects in the scene.
        fixtures: receptacles in the scene.
        layout: seeded sampler of initial (x, y, yaw) for every object and fixture.
        goals: ordered goals; success = all hold at the same time.
        max_steps: default episode length limit at the control rate.
        conveyor: a moving belt (the layout then also gives its start as
            ``layout[conveyor.name]``), or None for a scene that stands still.
    """

    name: str
    suite: str
    instruction: str
    objects: tuple[ObjectSpec, ...]
    fixtures: tuple[FixtureSpec, ...]
    layout: LayoutSampler
    goals: tuple[Goal, ...]
    max_steps: int = 200
    conveyor: ConveyorSpec | None = None

    def __post_init__(self) -> None:
        if not self.instruction.strip():
            raise ValueError(f"instruction: expected text for task {self.name!r}")
        if not self.goals:
            raise ValueError(f"goals: task {self.name!r} needs at least one goal")
        if self.max_steps < 1:
            raise ValueError(f"max_steps: expected >= 1, got {self.max_steps}")
        object_names = {o.name for o in self.objects}
        known = object_names | {f.name for f in self.fixtures}
        for goal in self.goals:
            if goal.obj not in object_names:
                raise ValueError(f"goals: {goal.obj!r} is not an object of task {self.name!r}; "
                                 f"objects are {sorted(object_names)}")
            if goal.target not in known:
                raise ValueError(f"goals: target {goal.target!r} is not in task {self.name!r}; "
                                 f"known names are {sorted(known)}")
        fixture_names = {f.name for f in self.fixtures}
        for name in self.conveyor.mounted if self.conveyor is not None else ():
            if name not in fixture_names:
                raise ValueError(f"conveyor: mounted {name!r} is not a fixture of task "
                                 f"{self.name!r}; fixtures are {sorted(fixture_names)}")

    def object(self, name: str) -> ObjectSpec:
        """The object called ``name``; ValueError when the task has none."""
        for spec in self.objects:
            if spec.name == name:
                return spec
        raise ValueError(f"name: no object {name!r} in task {self.name!r}")

    def fixture(self, name: str) -> FixtureSpec | None:
        """The fixture called ``name``, or None when ``name`` is an object."""
        return next((f for f in self.fixtures if f.name == name), None)


def jittered_layout(nominal: Mapping[str, tuple[float, float]], *, jitter_m: float = 0.02,
                    yaw_range_rad: float = np.pi / 4,
                    fixed_yaw: Mapping[str, float] | None = None,
                    facing_yaw: Mapping[str, float] | None = None) -> LayoutSampler:
    """A sampler that moves each nominal (x, y) by up to ``jitter_m`` and draws a yaw.

    Fixture yaws are fixed by ``fixed_yaw``. An object's yaw is uniform in +-``yaw_range_rad``
    around its facing direction: the bearing from the robot base plus ``facing_yaw[name]``
    (default 0). A long bar is given pi/2 so that it lies pointing at the robot, as it
    would be set down for a top grasp across it. Nominal positions are spaced by the task
    author so that jitter never makes bodies overlap.
    """
    fixed = dict(fixed_yaw or {})
    facing = dict(facing_yaw or {})

    def sample(rng: np.random.Generator) -> dict[str, tuple[float, float, float]]:
        out = {}
        for name, (x, y) in nominal.items():
            dx, dy = rng.uniform(-jitter_m, jitter_m, size=2)
            x, y = float(x + dx), float(y + dy)
            if name in fixed:
                yaw = fixed[name]
            else:
                yaw = float(np.arctan2(y, x) + facing.get(name, 0.0)
                            + rng.uniform(-yaw_range_rad, yaw_range_rad))
            out[name] = (x, y, yaw)
        return out

    return sample


def shuffled_layout(slots: tuple[tuple[float, float], ...], names: tuple[str, ...],
                    fixed: Mapping[str, tuple[float, float]], *, jitter_m: float = 0.02,
                    yaw_range_rad: float = np.pi / 4,
                    facing_yaw: Mapping[str, float] | None = None) -> LayoutSampler:
    """A sampler that puts ``names`` on a random permutation of ``slots``.

    Each object gets jitter and a random yaw; the ``fixed`` bodies stay at their nominal spots
    (plus jitter, yaw 0).
    """
    if len(slots) < len(names):
        raise ValueError(f"slots: need at least {len(names)} slots, got {len(slots)}")

    def sample(rng: np.random.Generator) -> dict[str, tuple[float, float, float]]:
        order = rng.permutation(len(slots))[: len(names)]
        nominal = {n: slots[i] for n, i in zip(names, order, strict=True)} | dict(fixed)
        return jittered_layout(nominal, jitter_m=jitter_m, yaw_range_rad=yaw_range_rad,
                               fixed_yaw={n: 0.0 for n in fixed}, facing_yaw=facing_yaw)(rng)

    return sample
