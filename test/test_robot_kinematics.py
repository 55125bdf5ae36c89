"""Our numpy PIPER kinematics against piper_sdk's own forward kinematics; the IK step converges."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from piper_sdk.kinematics.piper_fk import C_PiperForwardKinematics

from heisd_ros.geometry.rotations import (
    matrix_to_rpy,
    rotation_angle,
    rotvec_to_matrix,
    rpy_to_matrix,
)
from heisd_ros.robot.piper_kinematics import JOINT_LIMITS_RAD, PiperKinematics

joints = st.tuples(*(st.floats(lo, hi) for lo, hi in JOINT_LIMITS_RAD))


@pytest.mark.parametrize("dh_is_offset", [0, 1])
@settings(max_examples=60, deadline=None)
@given(q=joints)
def test_fk_matches_piper_sdk(dh_is_offset, q):
    ours = PiperKinematics(dh_is_offset).fk(np.array(q))
    ref = C_PiperForwardKinematics(dh_is_offset).CalFK(list(q))[5]  # flange: mm and degrees
    assert np.allclose(ours[:3, 3] * 1000.0, ref[:3], rtol=0.0, atol=1e-6)
    # The SDK snaps pitch to +-90 deg when |sin(pitch)| > 0.9999 (its gimbal-lock branch), so
    # its angles are only approximate there.
    assume(abs(ours[2, 0]) < 1.0 - 1e-4)
    # Compare orientations as rotations (Euler angles jump near gimbal lock).
    assert rotation_angle(ours[:3, :3], rpy_to_matrix(np.radians(ref[3:]))) < 1e-6


def test_zero_pose_is_the_sdk_documented_home():
    pose = PiperKinematics(1).fk(np.zeros(6))
    assert np.allclose(pose[:3, 3], [0.056128, 0.0, 0.213266], atol=1e-6)
    assert np.allclose(np.degrees(matrix_to_rpy(pose[:3, :3])), [0.0, 85.0, 0.0], atol=1e-9)


@settings(max_examples=30, deadline=None)
@given(dp=st.tuples(*(st.floats(-0.04, 0.04),) * 3), dr=st.tuples(*(st.floats(-0.2, 0.2),) * 3))
def test_ik_reaches_nearby_targets(dp, dr):
    kin = PiperKinematics()
    q0 = np.array([0.2, 1.2, -1.1, 0.1, 0.6, -0.2])  # a mid-workspace pose, away from limits
    target = kin.fk(q0)
    target[:3, 3] += dp
    target[:3, :3] = rotvec_to_matrix(np.array(dr)) @ target[:3, :3]
    q, err = kin.ik_step(q0, target, iterations=50)
    assert err < 1e-5
    reached = kin.fk(q)
    assert np.allclose(reached[:3, 3], target[:3, 3], atol=1e-5)
    assert np.all(q >= JOINT_LIMITS_RAD[:, 0]) and np.all(q <= JOINT_LIMITS_RAD[:, 1])


def test_invalid_dh_variant_is_rejected():
    with pytest.raises(ValueError, match="dh_is_offset"):
        PiperKinematics(2)
