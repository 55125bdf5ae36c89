"""MJCF for the simulated PIPER: six DH-exact revolute joints, a parallel gripper, a wrist camera.

Bodies sit at the fixed part of each modified-DH link transform (``piper_kinematics``), so
MuJoCo's flange frame equals piper_sdk's FK by construction; only primitive geoms are used
(capsules, cylinders, boxes) because full meshes cost ~5x in CPU rendering.

Collision groups (MuJoCo collides two geoms when ``contype_a & conaffinity_b`` or
``contype_b & conaffinity_a``): arm links 2/0 touch objects (1/3) but not the table (1/1) or
each other; fingers 2/1 touch objects and the table but not the arm.
"""

from __future__ import annotations

import numpy as np

from heisd_ros.geometry.rotations import matrix_to_quat_wxyz
from heisd_ros.robot.piper_kinematics import (
    FINGER_TIP_OFFSET_M,
    GRIPPER_RANGE_M,
    JOINT_LIMITS_RAD,
    JOINT_NAMES,
    TCP_OFFSET_M,
    dh_fixed_transforms,
)

#: Position-servo gains (N m/rad, N m s/rad); stiff enough that the EE lags its target by
#: well under a millimetre at the end of a 100 ms control step.
ARM_KP = 3000.0
ARM_KV = 30.0
#: Finger servo: kp (N/m) and force cap (N). The cap is what holds an object: closed target
#: 0 m against a 20 mm half-width block gives kp * 0.02 = 16 N, clipped to the cap.
FINGER_KP = 800.0
FINGER_FORCE_N = 12.0
FINGER_HALF_THICKNESS_M = 0.005

_ARM_GEOM = 'contype="2" conaffinity="0" group="1"'
_FINGER_GEOM = ('contype="2" conaffinity="1" condim="4" friction="1.5 0.02 0.001" '
                'solref="0.01 1" solimp="0.95 0.99 0.001" group="1"')


def _fmt(values) -> str:
    return " ".join(f"{float(v):.6g}" for v in values)


def _quat_wxyz(mat: np.ndarray) -> str:
    return _fmt(matrix_to_quat_wxyz(mat))


def lookat_xyaxes(pos: np.ndarray, target: np.ndarray, up: np.ndarray) -> str:
    """MJCF ``xyaxes`` for a camera at ``pos`` looking at ``target`` (cameras look along -z)."""
    forward = np.asarray(target, float) - np.asarray(pos, float)
    forward /= np.linalg.norm(forward)
    right = np.cross(forward, up)
    right /= np.linalg.norm(right)
    cam_up = np.cross(-forward, right)
    return _fmt(np.concatenate([right, cam_up]))


def _link_geoms(index: int) -> str:
    """Primitive geoms for link ``index``: a joint housing and a capsule to the next joint."""
    parts = [f'<geom type="cylinder" size="0.034 0.034" material="arm_dark" {_ARM_GEOM}/>']
    if index + 1 < 6:
        child = dh_fixed_transforms()[index + 1][:3, 3]
        if np.linalg.norm(child) > 1e-6:
            parts.append(f'<geom type="capsule" fromto="0 0 0 {_fmt(child)}" size="0.028" '
                         f'material="arm_light" {_ARM_GEOM}/>')
    return "\n".join(parts)


def _gripper_xml(wrist_camera_fovy_deg: float) -> str:
    """Flange, palm, two prismatic fingers, TCP site and wrist camera, in flange coordinates."""
    finger_travel_m = GRIPPER_RANGE_M[1] / 2.0
    finger_half_len = (FINGER_TIP_OFFSET_M - 0.095) / 2.0
    finger_z = FINGER_TIP_OFFSET_M - finger_half_len
    # Wrist camera beside the palm (off the finger axis, so fingers stay in view), aimed at a
    # point just beyond the finger tips.
    cam_pos = np.array([-0.052, 0.0, 0.09])
    cam_axes = lookat_xyaxes(cam_pos, np.array([0.0, 0.0, FINGER_TIP_OFFSET_M + 0.08]),
                             np.array([-1.0, 0.0, 0.0]))
    fingers = []
    for name, sign in (("finger_left", 1.0), ("finger_right", -1.0)):
        fingers.append(f"""
      <body name="{name}" gravcomp="1">
        <inertial pos="0 {sign * 0.005:g} {finger_z:g}" mass="0.03" diaginertia="1e-5 1e-5 1e-5"/>
        <joint name="{name}" type="slide" axis="0 {sign:g} 0" range="0 {finger_travel_m:g}"
               damping="2" armature="0.01"/>
        <geom name="{name}_pad" type="box"
              size="0.011 {FINGER_HALF_THICKNESS_M:g} {finger_half_len:g}"
              pos="0 {sign * FINGER_HALF_THICKNESS_M:g} {finger_z:g}" material="finger"
              {_FINGER_GEOM}/>
      </body>""")
    return f"""
      <geom type="cylinder" size="0.032 0.015" pos="0 0 0.015" material="arm_dark" {_ARM_GEOM}/>
      <geom name="palm" type="box" size="0.022 0.048 0.0325" pos="0 0 0.0625" material="arm_light"
            contype="2" conaffinity="1" group="1"/>
      <site name="flange" pos="0 0 0" size="0.005"/>
      <site name="tcp" pos="0 0 {TCP_OFFSET_M:g}" size="0.004" rgba="1 0 0 0.5" group="4"/>
      <camera name="wrist" pos="{_fmt(cam_pos)}" xyaxes="{cam_axes}"
              fovy="{wrist_camera_fovy_deg:g}"/>
      {"".join(fingers)}"""


def arm_body_xml(wrist_camera_fovy_deg: float = 75.0) -> str:
    """The arm as nested ``<body>`` elements rooted at the base frame (origin of the world)."""
    xml = _gripper_xml(wrist_camera_fovy_deg)
    for index in reversed(range(6)):
        fixed = dh_fixed_transforms()[index]
        lo, hi = JOINT_LIMITS_RAD[index]
        body = f"""
    <body name="link{index + 1}" pos="{_fmt(fixed[:3, 3])}" quat="{_quat_wxyz(fixed[:3, :3])}"
          gravcomp="1">
      <inertial pos="0 0 0" mass="{0.6 if index < 3 else 0.3:g}" diaginertia="2e-3 2e-3 2e-3"/>
      <joint name="{JOINT_NAMES[index]}" axis="0 0 1" range="{lo:g} {hi:g}" damping="1"
             armature="0.05"/>
      {_link_geoms(index) if index < 5 else ""}
      {xml}
    </body>"""
        xml = body
    base = ('<geom type="cylinder" size="0.055 0.045" pos="0 0 0.045" material="arm_dark" '
            'contype="0" conaffinity="0" group="1"/>'
            '<geom type="cylinder" size="0.04 0.04" pos="0 0 0.09" material="arm_light" '
            'contype="0" conaffinity="0" group="1"/>')
    return f'<body name="base_link">{base}{xml}</body>'


def arm_actuator_xml() -> str:
    """Joint position servos and the coupled finger servo (ctrl in m per finger)."""
    lines = []
    for index, name in enumerate(JOINT_NAMES):
        lo, hi = JOINT_LIMITS_RAD[index]
        lines.append(f'<position name="{name}" joint="{name}" kp="{ARM_KP:g}" kv="{ARM_KV:g}" '
                     f'ctrlrange="{lo:g} {hi:g}" forcerange="-60 60"/>')
    lines.append(f'<position name="gripper" joint="finger_left" kp="{FINGER_KP:g}" kv="10" '
                 f'ctrlrange="0 {GRIPPER_RANGE_M[1] / 2:g}" '
                 f'forcerange="{-FINGER_FORCE_N:g} {FINGER_FORCE_N:g}"/>')
    return "<actuator>" + "\n".join(lines) + "</actuator>"


def arm_equality_xml() -> str:
    """Mirror the right finger on the left one, like the real gripper's single drive."""
    return ('<equality><joint joint1="finger_right" joint2="finger_left" polycoef="0 1 0 0 0" '
            'solref="0.005 1"/></equality>')


def arm_materials_xml() -> str:
    """Materials the arm's geoms refer to."""
    return ('<material name="arm_dark" rgba="0.15 0.15 0.17 1"/>'
            '<material name="arm_light" rgba="0.78 0.78 0.8 1"/>'
            '<material name="finger" rgba="0.3 0.3 0.32 1"/>')
