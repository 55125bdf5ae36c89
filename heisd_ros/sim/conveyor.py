"""A conveyor belt on the table: a slab that slides along the base frame's y axis on its own.

The belt is a real physics body, not an animation: a slide joint driven by a stiff velocity
servo. Objects resting on it are carried by contact friction, and fixtures mounted on it (a
plate) ride with it, so the world moves with simulated time only. A lockstep control period
moves the belt by speed x period; in real time it keeps moving while the policy decides,
because every physics step (``PiperSimEnv.advance``) moves it.

The slab is finite (it carries its load; it does not loop): it starts centred at the layout's
``y`` for the conveyor's name and travels with everything on it. Static rails along the whole
table, visual only, show the track.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import mujoco
import numpy as np

from heisd_ros.sim.objects import FixtureSpec

#: Velocity-servo gain (N s/m) and belt mass (kg): time constant mass / gain = 10 ms, and a
#: 50 g block or a finger pressing on the belt changes its speed by well under 1 mm/s.
_BELT_KV = 300.0
_BELT_MASS_KG = 3.0
#: Belt vs. objects (1/3) and fingers/arm (2/x) but not the table (1/1), see piper_mjcf.
_BELT_GEOM = ('contype="2" conaffinity="2" condim="4" friction="1.2 0.02 0.001" '
              'solref="0.01 1" group="2"')


@dataclass(frozen=True)
class ConveyorSpec:
    """A belt along y at a fixed x, running at a per-episode speed drawn from a range.

    Attributes:
        name: body name; the task's layout gives its start centre as ``layout[name][1]``.
        x_m: the belt's centre line (base frame x).
        half_width_m: half its width across the belt (x).
        half_length_m: half its length along the belt (y).
        thickness_m: height of the belt's top above the table.
        speed_range_m_per_s: (low, high) of the signed speed along +y, drawn uniformly per
            episode; both of one sign (the direction is part of the task, not of the seed).
        mounted: names of the task's fixtures fixed on the belt at its centre (at most one).
        rgba: belt colour.
    """

    name: str = "conveyor"
    x_m: float = 0.34
    half_width_m: float = 0.08
    half_length_m: float = 0.30
    thickness_m: float = 0.01
    speed_range_m_per_s: tuple[float, float] = (0.02, 0.04)
    mounted: tuple[str, ...] = ()
    rgba: tuple[float, float, float, float] = (0.16, 0.17, 0.19, 1)

    def __post_init__(self) -> None:
        low, high = self.speed_range_m_per_s
        if not (low <= high and (low > 0.0 or high < 0.0)) or max(abs(low), abs(high)) > 0.2:
            raise ValueError(f"speed_range_m_per_s: expected (low, high) of one sign, nonzero "
                             f"and within +-0.2 m/s, got {self.speed_range_m_per_s}")
        if min(self.half_width_m, self.half_length_m, self.thickness_m) <= 0.0:
            raise ValueError(f"half_width_m/half_length_m/thickness_m: expected > 0, got "
                             f"{self.half_width_m}/{self.half_length_m}/{self.thickness_m}")
        if len(self.mounted) > 1:
            raise ValueError(f"mounted: at most one fixture rides the belt, got {self.mounted}")

    def xml(self, mounted: tuple[FixtureSpec, ...] = ()) -> str:
        """MJCF: static rails (visual only) and the sliding belt with ``mounted`` on top."""
        t, w, length = self.thickness_m, self.half_width_m, self.half_length_m
        rgba = " ".join(f"{v:g}" for v in self.rgba)
        rails = "".join(
            f'<geom name="{self.name}_rail{i}" type="box" size="0.006 0.6 {t / 2 + 0.002:g}" '
            f'pos="{self.x_m + side * (w + 0.008):g} 0 {t / 2 + 0.002:g}" '
            f'rgba="0.55 0.56 0.6 1" contype="0" conaffinity="0" group="2"/>'
            for i, side in enumerate((-1, 1)))
        riders = "".join(f.xml(mocap=False, pos_m=(0.0, 0.0, t / 2)) for f in mounted)
        return (f'{rails}<body name="{self.name}" pos="{self.x_m:g} 0 {t / 2:g}">'
                f'<joint name="{self.name}_slide" type="slide" axis="0 1 0"/>'
                f'<geom name="{self.name}_belt" type="box" size="{w:g} {length:g} {t / 2:g}" '
                f'rgba="{rgba}" mass="{_BELT_MASS_KG:g}" {_BELT_GEOM}/>{riders}</body>')

    def actuator_xml(self) -> str:
        """The belt's velocity servo (ctrl: belt speed along +y, m/s)."""
        return (f'<actuator><velocity name="{self.name}_drive" joint="{self.name}_slide" '
                f'kv="{_BELT_KV:g}" ctrlrange="-0.2 0.2"/></actuator>')


class ConveyorDrive:
    """The belt of one MuJoCo model: puts it at its start and sets it running each episode."""

    def __init__(self, model: mujoco.MjModel, spec: ConveyorSpec) -> None:
        self.spec = spec
        joint = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, f"{spec.name}_slide")
        self._qpos = int(model.jnt_qposadr[joint])
        self._dof = int(model.jnt_dofadr[joint])
        self._actuator = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_ACTUATOR,
                                           f"{spec.name}_drive")
        self.speed_m_per_s = 0.0
        self._start_y_m = 0.0

    def reset(self, data: mujoco.MjData, layout: Mapping[str, tuple[float, float, float]],
              rng: np.random.Generator) -> float:
        """Place the belt at the layout's start, draw and set its speed; returns the speed.

        The belt starts already at speed (qvel and servo target alike), so it has no
        start-up transient: its displacement is exactly speed x world time from the start.
        """
        self._start_y_m = float(layout[self.spec.name][1])
        self.speed_m_per_s = float(rng.uniform(*self.spec.speed_range_m_per_s))
        data.qpos[self._qpos] = self._start_y_m
        data.qvel[self._dof] = self.speed_m_per_s
        data.ctrl[self._actuator] = self.speed_m_per_s
        return self.speed_m_per_s

    def carries(self, x_m: float, y_m: float) -> bool:
        """True when (x, y) lies on the belt as it was placed by :meth:`reset`."""
        return bool(abs(x_m - self.spec.x_m) < self.spec.half_width_m
                    and abs(y_m - self._start_y_m) < self.spec.half_length_m)
