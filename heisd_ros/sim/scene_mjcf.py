"""The whole tabletop scene as one MJCF string: table, PIPER, objects, receptacles, cameras.

World frame = the arm's base frame (``base_link``): x forward, z up, table top at z = 0. So
every pose the simulator reports is already in the frame the real driver publishes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from heisd_ros.sim.conveyor import ConveyorSpec
from heisd_ros.sim.objects import FixtureSpec, ObjectSpec
from heisd_ros.sim.piper_mjcf import (
    arm_actuator_xml,
    arm_body_xml,
    arm_equality_xml,
    arm_materials_xml,
    lookat_xyaxes,
)

#: Third-person camera: front-left of the arm, looking at the middle of the workspace.
THIRD_PERSON_POS_M = np.array([0.74, 0.30, 0.50])
THIRD_PERSON_TARGET_M = np.array([0.22, 0.0, 0.10])


def build_scene_xml(objects: Sequence[ObjectSpec], fixtures: Sequence[FixtureSpec], *,
                    image_width_px: int = 224, image_height_px: int = 224,
                    third_person_fovy_deg: float = 55.0, wrist_fovy_deg: float = 75.0,
                    physics_timestep_s: float = 0.002,
                    conveyor: ConveyorSpec | None = None) -> str:
    """Return the MJCF text of a tabletop scene with the given objects and receptacles.

    With a ``conveyor``, its belt is added, and the fixtures it names as mounted ride on it
    instead of being mocap bodies.
    """
    names = [o.name for o in objects] + [f.name for f in fixtures]
    if conveyor is not None:
        names.append(conveyor.name)
    if len(set(names)) != len(names):
        raise ValueError(f"objects/fixtures: names must be unique, got {names}")
    mounted_names = set(conveyor.mounted) if conveyor is not None else set()
    mounted = tuple(f for f in fixtures if f.name in mounted_names)
    fixed = [f for f in fixtures if f.name not in mounted_names]
    belt_xml = conveyor.xml(mounted) if conveyor is not None else ""
    belt_actuator_xml = conveyor.actuator_xml() if conveyor is not None else ""
    third_axes = lookat_xyaxes(THIRD_PERSON_POS_M, THIRD_PERSON_TARGET_M, np.array([0, 0, 1.0]))
    third_pos = " ".join(f"{v:g}" for v in THIRD_PERSON_POS_M)
    # offsamples=0 and no shadows: CPU (Mesa llvmpipe) rendering cost is dominated by MSAA
    # and the shadow pass; without them two 224x224 cameras render in a few ms.
    return f"""<mujoco model="piper_tabletop">
  <compiler angle="radian" autolimits="true"/>
  <option timestep="{physics_timestep_s:g}" integrator="implicitfast" cone="elliptic"
          impratio="10"/>
  <visual>
    <quality offsamples="0" shadowsize="0"/>
    <global offwidth="{max(image_width_px, 64)}" offheight="{max(image_height_px, 64)}"/>
    <headlight ambient="0.35 0.35 0.35" diffuse="0.45 0.45 0.45" specular="0 0 0"/>
  </visual>
  <asset>
    <texture name="sky" type="skybox" builtin="gradient" rgb1="0.55 0.62 0.7" rgb2="0.2 0.22 0.25"
             width="64" height="64"/>
    <texture name="wood" type="2d" builtin="checker" rgb1="0.62 0.5 0.38" rgb2="0.58 0.46 0.34"
             width="64" height="64"/>
    <material name="table" texture="wood" texrepeat="8 8"/>
    <material name="floor" rgba="0.3 0.3 0.32 1"/>
    {arm_materials_xml()}
  </asset>
  <worldbody>
    <light name="key" directional="true" pos="0.3 -0.3 1.5" dir="-0.2 0.2 -1" castshadow="false"
           diffuse="0.55 0.55 0.55"/>
    <geom name="floor" type="plane" size="2 2 0.1" pos="0 0 -0.75" material="floor"
          contype="0" conaffinity="0"/>
    <geom name="table" type="box" size="0.5 0.65 0.02" pos="0.32 0 -0.02" material="table"
          contype="1" conaffinity="1" friction="0.8 0.005 0.0001"/>
    <camera name="third_person" pos="{third_pos}" xyaxes="{third_axes}"
            fovy="{third_person_fovy_deg:g}"/>
    {arm_body_xml(wrist_fovy_deg)}
    {"".join(o.xml() for o in objects)}
    {"".join(f.xml() for f in fixed)}
    {belt_xml}
  </worldbody>
  {arm_equality_xml()}
  {arm_actuator_xml()}
  {belt_actuator_xml}
</mujoco>"""
