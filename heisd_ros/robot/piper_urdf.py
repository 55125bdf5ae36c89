"""URDF of the PIPER arm, generated from the same kinematic table as the driver's FK and the sim.

The link frames are the fixed parts of the modified-DH link transforms of
:mod:`heisd_ros.robot.piper_kinematics` (its ``dh_fixed_transforms``, the function the MuJoCo
model is built from): each URDF joint sits at that fixed transform and turns about its own z
axis, so ``base_link -> link6`` is the flange pose the driver's FK and piper_sdk 0.6.2's
``C_PiperForwardKinematics`` (``dh_is_offset=1``) report. The tests compare the three over
random joint vectors.

Joint names are the ones the driver publishes on ``/joint_states``: ``joint1`` .. ``joint6`` in
rad and ``gripper``, the opening between the fingers in m. ``gripper`` moves a frame without
geometry (``gripper_opening``) by the opening along the flange y axis; the two finger joints,
``finger_left`` and ``finger_right``, mimic it with half the travel each, along +y and -y of the
flange as in the simulator. The visuals are primitive shapes matching the MJCF's.

The committed ``urdf/piper.urdf`` is this text; regenerate it with
``python scripts/write_piper_urdf.py``.
"""

from __future__ import annotations

import numpy as np

from heisd_ros.geometry.rotations import matrix_to_rpy
from heisd_ros.robot.piper_kinematics import (
    FINGER_TIP_OFFSET_M,
    GRIPPER_RANGE_M,
    JOINT_LIMITS_RAD,
    JOINT_NAMES,
    dh_fixed_transforms,
)

__all__ = ["FINGER_JOINT_NAMES", "FLANGE_LINK", "GRIPPER_JOINT_NAME", "ROOT_LINK", "piper_urdf"]

#: The opening of the gripper in m, as the driver names it in ``/joint_states``.
GRIPPER_JOINT_NAME = "gripper"
#: The two prismatic finger joints (mimic ``gripper``, half its travel each).
FINGER_JOINT_NAMES = ("finger_left", "finger_right")
ROOT_LINK = "base_link"
#: The frame the driver's FK and the arm's end-pose feedback report.
FLANGE_LINK = "link6"

# Effort (N m, N) and speed (rad/s, m/s) limits are not in the kinematic table; URDF requires
# them on revolute and prismatic joints, and nothing here reads them.
_ARM_EFFORT, _ARM_VELOCITY = 60.0, 3.0
_FINGER_EFFORT, _FINGER_VELOCITY = 12.0, 0.1
_HOUSING_RADIUS_M, _HOUSING_LENGTH_M = 0.034, 0.068
_LINK_RADIUS_M = 0.028


def _num(value: float) -> str:
    """A float with enough digits for sub-micrometre chains, and exact zeros for round-off."""
    value = float(value)
    return "0" if abs(value) < 1e-12 else f"{value:.15g}"


def _vec(values) -> str:
    return " ".join(_num(v) for v in values)


def _origin(xyz, rot: np.ndarray | None = None) -> str:
    rpy = matrix_to_rpy(rot) if rot is not None else np.zeros(3)
    return f'<origin xyz="{_vec(xyz)}" rpy="{_vec(rpy)}"/>'


def _z_to(direction: np.ndarray) -> np.ndarray:
    """A rotation taking +z onto unit ``direction`` (URDF cylinders lie along their z)."""
    z = direction / np.linalg.norm(direction)
    helper = np.array([1.0, 0.0, 0.0]) if abs(z[0]) < 0.9 else np.array([0.0, 1.0, 0.0])
    x = np.cross(helper, z)
    x /= np.linalg.norm(x)
    return np.column_stack([x, np.cross(z, x), z])


def _visual(geometry: str, origin: str, material: str) -> str:
    return (f'    <visual>\n      {origin}\n      <geometry>{geometry}</geometry>\n'
            f'      <material name="{material}"/>\n    </visual>\n')


def _cylinder(radius_m: float, length_m: float) -> str:
    return f'<cylinder radius="{_num(radius_m)}" length="{_num(length_m)}"/>'


def _box(size_m) -> str:
    return f'<box size="{_vec(size_m)}"/>'


def _link(name: str, visuals: str = "") -> str:
    if not visuals:
        return f'  <link name="{name}"/>\n'
    return f'  <link name="{name}">\n{visuals}  </link>\n'


def _arm_link_visuals(index: int, fixed: list[np.ndarray]) -> str:
    """Joint housing of link ``index`` and a cylinder to the next joint, as in the MJCF."""
    out = _visual(_cylinder(_HOUSING_RADIUS_M, _HOUSING_LENGTH_M), _origin(np.zeros(3)),
                  "arm_dark")
    if index + 1 < 6:
        child = fixed[index + 1][:3, 3]
        length = float(np.linalg.norm(child))
        if length > 1e-6:
            out += _visual(_cylinder(_LINK_RADIUS_M, length),
                           _origin(child / 2.0, _z_to(child)), "arm_light")
    return out


def _gripper_visuals() -> str:
    """Flange disc and palm, in flange coordinates (the MJCF's sizes)."""
    return (_visual(_cylinder(0.032, 0.03), _origin([0.0, 0.0, 0.015]), "arm_dark")
            + _visual(_box([0.044, 0.096, 0.065]), _origin([0.0, 0.0, 0.0625]), "arm_light"))


def _finger_visual(sign: float) -> str:
    half_len_m = (FINGER_TIP_OFFSET_M - 0.095) / 2.0
    return _visual(_box([0.022, 0.01, 2.0 * half_len_m]),
                   _origin([0.0, sign * 0.005, FINGER_TIP_OFFSET_M - half_len_m]), "finger")


def _joint(name: str, kind: str, parent: str, child: str, origin: str, axis, lower: float,
           upper: float, effort: float, velocity: float, mimic: str = "") -> str:
    return (f'  <joint name="{name}" type="{kind}">\n    {origin}\n'
            f'    <parent link="{parent}"/>\n    <child link="{child}"/>\n'
            f'    <axis xyz="{_vec(axis)}"/>\n'
            f'    <limit lower="{_num(lower)}" upper="{_num(upper)}" effort="{_num(effort)}" '
            f'velocity="{_num(velocity)}"/>\n{mimic}  </joint>\n')


def piper_urdf(name: str = "piper") -> str:
    """The URDF text of the PIPER with its parallel gripper (metres, radians)."""
    fixed = dh_fixed_transforms()
    parts = [
        '<?xml version="1.0"?>\n',
        "<!-- Generated by heisd_ros.robot.piper_urdf from the modified-DH table in\n"
        "     heisd_ros/robot/piper_kinematics.py (piper_sdk 0.6.2's C_PiperForwardKinematics,\n"
        "     dh_is_offset=1); regenerate with `python scripts/write_piper_urdf.py`. -->\n",
        f'<robot name="{name}">\n',
        '  <material name="arm_dark"><color rgba="0.15 0.15 0.17 1"/></material>\n',
        '  <material name="arm_light"><color rgba="0.78 0.78 0.8 1"/></material>\n',
        '  <material name="finger"><color rgba="0.3 0.3 0.32 1"/></material>\n',
        _link(ROOT_LINK, _visual(_cylinder(0.055, 0.09), _origin([0.0, 0.0, 0.045]), "arm_dark")
              + _visual(_cylinder(0.04, 0.08), _origin([0.0, 0.0, 0.09]), "arm_light")),
    ]
    parent = ROOT_LINK
    for index, joint_name in enumerate(JOINT_NAMES):
        link = f"link{index + 1}"
        lower, upper = JOINT_LIMITS_RAD[index]
        parts.append(_joint(joint_name, "revolute", parent, link,
                            _origin(fixed[index][:3, 3], fixed[index][:3, :3]), (0, 0, 1),
                            lower, upper, _ARM_EFFORT, _ARM_VELOCITY))
        visuals = _arm_link_visuals(index, fixed) if index < 5 else _gripper_visuals()
        parts.append(_link(link, visuals))
        parent = link
    # The opening (m) is the one actuated gripper joint; each finger travels half of it.
    lower_m, upper_m = GRIPPER_RANGE_M
    parts.append(_joint(GRIPPER_JOINT_NAME, "prismatic", FLANGE_LINK, "gripper_opening",
                        _origin(np.zeros(3)), (0, 1, 0), lower_m, upper_m, _FINGER_EFFORT,
                        2.0 * _FINGER_VELOCITY))
    parts.append(_link("gripper_opening"))
    mimic = f'    <mimic joint="{GRIPPER_JOINT_NAME}" multiplier="0.5" offset="0"/>\n'
    for joint_name, sign in zip(FINGER_JOINT_NAMES, (1.0, -1.0), strict=True):
        parts.append(_joint(joint_name, "prismatic", FLANGE_LINK, f"{joint_name}_link",
                            _origin(np.zeros(3)), (0, sign, 0), lower_m / 2.0, upper_m / 2.0,
                            _FINGER_EFFORT, _FINGER_VELOCITY, mimic))
        parts.append(_link(f"{joint_name}_link", _finger_visual(sign)))
    parts.append("</robot>\n")
    return "".join(parts)
