"""The generated PIPER URDF: committed text, joint names, and FK against ours and piper_sdk's.

The URDF is read back with yourdfpy (an independent URDF parser and FK), so a wrong origin,
axis or rpy convention in the generator shows up as a pose error at the flange. When the
generator changes, regenerate the committed file with ``python scripts/write_piper_urdf.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yourdfpy
from piper_sdk.kinematics.piper_fk import C_PiperForwardKinematics

from heisd_ros.geometry.rotations import rotation_angle, rpy_to_matrix
from heisd_ros.nodes.robot_msgs import GRIPPER_JOINT_NAME, PIPER_JOINT_NAMES
from heisd_ros.robot.piper_kinematics import GRIPPER_RANGE_M, JOINT_LIMITS_RAD, PiperKinematics
from heisd_ros.robot.piper_urdf import FINGER_JOINT_NAMES, FLANGE_LINK, ROOT_LINK, piper_urdf

URDF_PATH = Path(__file__).resolve().parents[1] / "urdf" / "piper.urdf"
SAMPLES = 1000
TOLERANCE_M = 1e-6
TOLERANCE_RAD = 1e-6


@pytest.fixture(scope="module")
def robot() -> yourdfpy.URDF:
    return yourdfpy.URDF.load(str(URDF_PATH), load_meshes=False)


def test_committed_urdf_is_the_generated_text():
    assert URDF_PATH.read_text() == piper_urdf(), (
        "urdf/piper.urdf is stale: run `python scripts/write_piper_urdf.py`")


def test_joint_names_are_the_drivers_and_limits_the_kinematics(robot):
    assert robot.actuated_joint_names == [*PIPER_JOINT_NAMES, GRIPPER_JOINT_NAME]
    for name, (lower, upper) in zip(PIPER_JOINT_NAMES, JOINT_LIMITS_RAD, strict=True):
        joint = robot.joint_map[name]
        assert joint.type == "revolute"
        assert (joint.limit.lower, joint.limit.upper) == pytest.approx((lower, upper))
    gripper = robot.joint_map[GRIPPER_JOINT_NAME]
    assert (gripper.limit.lower, gripper.limit.upper) == pytest.approx(GRIPPER_RANGE_M)
    for name in FINGER_JOINT_NAMES:
        finger = robot.joint_map[name]
        assert finger.type == "prismatic" and finger.mimic.joint == GRIPPER_JOINT_NAME
        assert finger.limit.upper == pytest.approx(GRIPPER_RANGE_M[1] / 2.0)


def test_fingers_each_travel_half_the_opening_along_flange_y(robot):
    opening_m = 0.05
    robot.update_cfg({GRIPPER_JOINT_NAME: opening_m})
    left = robot.get_transform(f"{FINGER_JOINT_NAMES[0]}_link", FLANGE_LINK)[:3, 3]
    right = robot.get_transform(f"{FINGER_JOINT_NAMES[1]}_link", FLANGE_LINK)[:3, 3]
    np.testing.assert_allclose(left, [0.0, opening_m / 2.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(right, [0.0, -opening_m / 2.0, 0.0], atol=1e-12)


def test_flange_fk_matches_ours_and_piper_sdk_at_random_joints(robot):
    ours = PiperKinematics(dh_is_offset=1)
    sdk = C_PiperForwardKinematics(dh_is_offset=1)
    rng = np.random.default_rng(20261206)
    ours_m, ours_rad, sdk_m, sdk_rad, near_lock = 0.0, 0.0, 0.0, 0.0, 0
    for _ in range(SAMPLES):
        q = rng.uniform(JOINT_LIMITS_RAD[:, 0], JOINT_LIMITS_RAD[:, 1])
        robot.update_cfg(dict(zip(PIPER_JOINT_NAMES, q, strict=True)))
        urdf_pose = robot.get_transform(FLANGE_LINK, ROOT_LINK)
        pose = ours.fk(q)
        ours_m = max(ours_m, float(np.linalg.norm(urdf_pose[:3, 3] - pose[:3, 3])))
        ours_rad = max(ours_rad, rotation_angle(urdf_pose[:3, :3], pose[:3, :3]))
        ref = np.array(sdk.CalFK(list(q))[5])  # flange: x, y, z mm; roll, pitch, yaw deg
        sdk_m = max(sdk_m, float(np.linalg.norm(urdf_pose[:3, 3] - ref[:3] / 1000.0)))
        # The SDK snaps pitch to +-90 deg when |sin(pitch)| > 0.9999 (its gimbal-lock branch),
        # so its angles are only approximate there; its position is exact everywhere.
        if abs(urdf_pose[2, 0]) >= 1.0 - 1e-4:
            near_lock += 1
            continue
        sdk_rot = rpy_to_matrix(np.radians(ref[3:]))
        sdk_rad = max(sdk_rad, rotation_angle(urdf_pose[:3, :3], sdk_rot))
    print(f"URDF flange vs our FK: {ours_m:.3g} m, {ours_rad:.3g} rad; vs piper_sdk: "
          f"{sdk_m:.3g} m, {sdk_rad:.3g} rad ({SAMPLES} samples, {near_lock} near gimbal lock "
          "left out of the SDK's orientation)")
    assert ours_m < TOLERANCE_M and ours_rad < TOLERANCE_RAD
    assert sdk_m < TOLERANCE_M and sdk_rad < TOLERANCE_RAD
