"""Graspable objects and fixed receptacles of the tabletop, and their MJCF.

Objects are free bodies held by contact and friction only (no weld). Receptacles (plate,
basket) are mocap bodies: immovable in physics, but re-placed at every reset; or, mounted on
a moving body (``conveyor``), plain child bodies that ride with it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

OBJECT_SHAPES = ("box", "cylinder")
FIXTURE_KINDS = ("plate", "basket")

_OBJECT_GEOM = ('contype="1" conaffinity="3" condim="4" friction="1.2 0.02 0.001" '
                'solref="0.01 1" solimp="0.95 0.99 0.001" group="2"')
_FIXTURE_GEOM = 'contype="1" conaffinity="3" condim="3" friction="0.8 0.005 0.0001" group="2"'


@dataclass(frozen=True)
class ObjectSpec:
    """A graspable rigid object.

    Attributes:
        name: body name, also used in instructions' bookkeeping.
        shape: "box" (half_size_m = x, y, z half extents) or "cylinder" (radius, half height).
        half_size_m: half extents in metres, see ``shape``.
        rgba: colour, 4 floats in [0, 1].
        mass_kg: mass.
        grasp_symmetry_rad: yaw period of equivalent grasps (pi/2 for a square block, pi for a
            bar, 0 for a cylinder = any yaw).
    """

    name: str
    shape: str
    half_size_m: tuple[float, ...]
    rgba: tuple[float, float, float, float]
    mass_kg: float = 0.05
    grasp_symmetry_rad: float = np.pi / 2

    def __post_init__(self) -> None:
        if self.shape not in OBJECT_SHAPES:
            raise ValueError(f"shape: expected one of {OBJECT_SHAPES}, got {self.shape!r}")
        expected = 3 if self.shape == "box" else 2
        if len(self.half_size_m) != expected or min(self.half_size_m) <= 0.0:
            raise ValueError(f"half_size_m: expected {expected} positive values for a "
                             f"{self.shape}, got {self.half_size_m}")
        if len(self.rgba) != 4:
            raise ValueError(f"rgba: expected 4 values, got {self.rgba}")
        if self.mass_kg <= 0.0:
            raise ValueError(f"mass_kg: expected > 0, got {self.mass_kg}")

    @property
    def half_height_m(self) -> float:
        """Half the object's height when it stands upright (m)."""
        return float(self.half_size_m[-1])

    def xml(self) -> str:
        """MJCF ``<body>`` with a free joint and one geom."""
        size = " ".join(f"{v:g}" for v in self.half_size_m)
        rgba = " ".join(f"{v:g}" for v in self.rgba)
        return (f'<body name="{self.name}"><freejoint name="{self.name}_free"/>'
                f'<geom name="{self.name}_geom" type="{self.shape}" size="{size}" rgba="{rgba}" '
                f'mass="{self.mass_kg:g}" {_OBJECT_GEOM}/></body>')


@dataclass(frozen=True)
class FixtureSpec:
    """A receptacle: a flat plate or an open square basket.

    ``radius_m`` is the plate's radius, or the inner half width of the basket's floor.
    """

    name: str
    kind: str
    radius_m: float
    rgba: tuple[float, float, float, float]
    wall_height_m: float = 0.05

    def __post_init__(self) -> None:
        if self.kind not in FIXTURE_KINDS:
            raise ValueError(f"kind: expected one of {FIXTURE_KINDS}, got {self.kind!r}")
        if self.radius_m <= 0.0:
            raise ValueError(f"radius_m: expected > 0, got {self.radius_m}")

    @property
    def support_height_m(self) -> float:
        """Height of the surface an object rests on, above the table (m)."""
        return 0.008 if self.kind == "plate" else 0.006

    def xml(self, *, mocap: bool = True, pos_m: tuple[float, float, float] = (0, 0, 0)) -> str:
        """MJCF ``<body>``: a disc, or a floor and four walls.

        ``mocap=False`` gives a plain body at ``pos_m`` in its parent, to mount the fixture on
        a moving body (a conveyor belt) whose motion it then shares.
        """
        rgba = " ".join(f"{v:g}" for v in self.rgba)
        if self.kind == "plate":
            geoms = (f'<geom name="{self.name}_floor" type="cylinder" '
                     f'size="{self.radius_m:g} 0.004" pos="0 0 0.004" rgba="{rgba}" '
                     f'{_FIXTURE_GEOM}/>')
        else:
            r, t, h = self.radius_m, 0.005, self.wall_height_m
            geoms = (f'<geom name="{self.name}_floor" type="box" '
                     f'size="{r + t:g} {r + t:g} 0.003" pos="0 0 0.003" rgba="{rgba}" '
                     f'{_FIXTURE_GEOM}/>')
            walls = ((r + t / 2, 0, t / 2, r + t), (-r - t / 2, 0, t / 2, r + t),
                     (0, r + t / 2, r, t / 2), (0, -r - t / 2, r, t / 2))
            for i, (x, y, sx, sy) in enumerate(walls):
                geoms += (f'<geom name="{self.name}_wall{i}" type="box" '
                          f'size="{sx:g} {sy:g} {h / 2:g}" pos="{x:g} {y:g} {h / 2:g}" '
                          f'rgba="{rgba}" {_FIXTURE_GEOM}/>')
        if mocap:
            return f'<body name="{self.name}" mocap="true">{geoms}</body>'
        pos = " ".join(f"{v:g}" for v in pos_m)
        return f'<body name="{self.name}" pos="{pos}">{geoms}</body>'
