"""Messages of the policy node: robot state in, EE command, HybridStep and EE pose out.

Conversions only (no node, no publishing): the node calls these and publishes the results.
"""

from __future__ import annotations

import math

import numpy as np
from builtin_interfaces.msg import Time
from geometry_msgs.msg import PoseStamped
from sensor_msgs.msg import JointState

from heisd_ros.geometry.rotations import rpy_to_quat_xyzw
from heisd_ros.msg import EECommand, HybridStep
from heisd_ros.nodes.policy_decoders import DecodedStep
from heisd_ros.nodes.policy_inputs import RobotInput
from heisd_ros.nodes.robot_msgs import pose_from_msg, stamp_to_seconds

_HYBRID_TYPES = HybridStep.get_fields_and_field_types()
_HYBRID_FIELDS = frozenset(_HYBRID_TYPES)
RETRIEVAL_UNAVAILABLE = "retrieval unavailable: no retrieval drafts until it is back"


def robot_input(joint: JointState, pose: PoseStamped) -> tuple[RobotInput | None, str]:
    """(robot input, "") of the latest joint state and EE pose, or (None, the problem).

    A non-finite or all-zero-quaternion pose becomes NaN position and rpy, which the input
    gate refuses as "NaN in the robot state". The stamp is the newer of the two messages'.
    """
    if len(joint.position) != 7:
        return None, (f"malformed joint state: {len(joint.position)} positions, expected 6 "
                      f"joints + gripper")
    position, rpy = pose_from_msg(pose) if _finite_pose(pose) else (
        np.full(3, np.nan), np.full(3, np.nan))
    return RobotInput(max(stamp_to_seconds(joint.header.stamp),
                          stamp_to_seconds(pose.header.stamp)),
                      np.asarray(joint.position[:6]), float(joint.position[6]),
                      position, rpy), ""


def command_msg(step: DecodedStep, step_index: int, stamp: Time, frame_id: str) -> EECommand:
    """The delta EE command of one decoded step (gripper closed when the action's >= 0.5)."""
    action = step.action
    cmd = EECommand(step_index=step_index, mode=EECommand.MODE_DELTA,
                    gripper=EECommand.GRIPPER_CLOSED if action[6] >= 0.5
                    else EECommand.GRIPPER_OPEN,
                    gripper_from_target=bool(step.gripper_from_target), source=int(step.source))
    cmd.header.stamp, cmd.header.frame_id = stamp, frame_id
    cmd.translation_m.x, cmd.translation_m.y, cmd.translation_m.z = (float(v)
                                                                     for v in action[:3])
    cmd.rotation_rad.x, cmd.rotation_rad.y, cmd.rotation_rad.z = (float(v)
                                                                  for v in action[3:6])
    return cmd


def hybrid_step_msg(step: DecodedStep, step_index: int, stamp: Time, frame_id: str, task: str,
                    retrieval_available: bool | None) -> HybridStep:
    """The status of one decoded step.

    A step without a status of its own says so when the retrieval service is known to be
    down (``retrieval_available`` False).
    """
    msg = HybridStep(step_index=step_index, task=task)
    msg.header.stamp, msg.header.frame_id = stamp, frame_id
    for name, value in step.fields.items():
        if name in _HYBRID_FIELDS:
            setattr(msg, name, _fit(name, value))
    msg.action_bins = [int(b) for b in step.bins]
    msg.action = [float(a) for a in step.action]
    if not step.fields.get("status") and retrieval_available is False:
        msg.status = RETRIEVAL_UNAVAILABLE
    return msg


def robot_pose_msg(robot: RobotInput, stamp: Time, frame_id: str) -> PoseStamped:
    """The EE pose the step acted on, for the executed path."""
    pose = PoseStamped()
    pose.header.stamp, pose.header.frame_id = stamp, frame_id
    pose.pose.position.x, pose.pose.position.y, pose.pose.position.z = (
        float(v) for v in robot.ee_position_m)
    o = pose.pose.orientation
    o.x, o.y, o.z, o.w = rpy_to_quat_xyzw(robot.ee_rpy_rad)
    return pose


def _finite_pose(msg: PoseStamped) -> bool:
    p, o = msg.pose.position, msg.pose.orientation
    values = (p.x, p.y, p.z, o.x, o.y, o.z, o.w)
    return all(math.isfinite(v) for v in values) and any(v != 0.0 for v in values[3:])


def _fit(name: str, value):
    """A HybridStep field value of the field's Python type (NaN allowed in floats)."""
    kind = _HYBRID_TYPES[name]
    if kind.startswith("sequence<") or kind.endswith("]"):  # sequence<uint8>, double[7]
        element = kind.removeprefix("sequence<").split(">")[0].split("[")[0]
        return [_fit_scalar(element, v) for v in value]
    return _fit_scalar(kind, value)


def _fit_scalar(kind: str, value):
    if kind == "string":
        return str(value)
    if kind == "boolean":
        return bool(value)
    if kind in ("float", "double"):
        return float(value)
    return int(value)
