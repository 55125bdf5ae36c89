"""Conversions between ROS messages and the robot library's records (no node, no I/O).

Shared by the PIPER driver node and the sim node, which publish and accept the same topics:

- ``heisd_ros/msg/EECommand`` <-> :class:`heisd_ros.robot.base.EECommand` (same fields, same
  constant numbers; the library record keeps non-finite numbers so the safety filter can
  reject them with a reason).
- :class:`heisd_ros.robot.base.RobotState` -> ``sensor_msgs/JointState`` (joint1..joint6 in rad,
  then the gripper opening in m) and ``geometry_msgs/PoseStamped`` (flange position in m,
  orientation as a quaternion).
- :class:`~heisd_ros.robot.base.RobotState` and
  :class:`~heisd_ros.robot.controller.ControllerStatus` -> ``diagnostic_msgs`` levels, messages
  and key/values (an arm that is not heard on the bus is always reported as "CAN lost: ...").

Orientation convention (:mod:`heisd_ros.geometry.rotations`): roll/pitch/yaw are rotations
about the fixed x, y, z axes (extrinsic XYZ, ``R = Rz(yaw) @ Ry(pitch) @ Rx(roll)``), which is
what the PIPER reports and what ``EECommand.rotation_rad`` means. The quaternion is
(x, y, z, w) with w >= 0.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence

import numpy as np
from builtin_interfaces.msg import Time
from diagnostic_msgs.msg import DiagnosticStatus, KeyValue
from geometry_msgs.msg import PoseStamped
from sensor_msgs.msg import JointState

from heisd_ros.geometry.rotations import quat_xyzw_to_rpy, rpy_to_quat_xyzw
from heisd_ros.msg import EECommand as EECommandMsg
from heisd_ros.robot.base import EECommand, RobotFault, RobotState
from heisd_ros.robot.controller import ControllerStatus

#: Joint names of the PIPER as AgileX's URDF names them, then the gripper opening.
PIPER_JOINT_NAMES = ("joint1", "joint2", "joint3", "joint4", "joint5", "joint6")
GRIPPER_JOINT_NAME = "gripper"
#: Faults that mean the arm is not heard on the bus.
CAN_FAULTS = frozenset({RobotFault.CAN_LOST, RobotFault.STALE_FEEDBACK})


def stamp_to_seconds(stamp: Time) -> float:
    """A ``builtin_interfaces/Time`` in seconds."""
    return stamp.sec + stamp.nanosec * 1e-9


def seconds_to_stamp(seconds: float) -> Time:
    """Seconds (>= 0) as a ``builtin_interfaces/Time``."""
    sec = math.floor(seconds)
    nanosec = min(int(round((seconds - sec) * 1e9)), 999_999_999)
    return Time(sec=int(sec), nanosec=nanosec)


def ee_command_from_msg(msg: EECommandMsg) -> EECommand:
    """The library record of one command message.

    Raises:
        ValueError: a field the record cannot hold (an unknown mode, gripper or source
            number), naming the field. Non-finite numbers are *not* an error here.
    """
    return EECommand(
        translation_m=(msg.translation_m.x, msg.translation_m.y, msg.translation_m.z),
        rotation_rad=(msg.rotation_rad.x, msg.rotation_rad.y, msg.rotation_rad.z),
        gripper=int(msg.gripper),
        gripper_from_target=bool(msg.gripper_from_target),
        mode=int(msg.mode),
        source=int(msg.source),
        step_index=int(msg.step_index),
        stamp_s=stamp_to_seconds(msg.header.stamp),
        frame_id=msg.header.frame_id,
    )


def ee_command_to_msg(command: EECommand) -> EECommandMsg:
    """The message of one library command (what a policy node publishes)."""
    msg = EECommandMsg()
    msg.header.stamp = seconds_to_stamp(command.stamp_s)
    msg.header.frame_id = command.frame_id
    msg.step_index = command.step_index
    msg.mode = int(command.mode)
    msg.translation_m.x, msg.translation_m.y, msg.translation_m.z = (
        float(v) for v in command.translation_m
    )
    msg.rotation_rad.x, msg.rotation_rad.y, msg.rotation_rad.z = (
        float(v) for v in command.rotation_rad
    )
    msg.gripper = int(command.gripper)
    msg.gripper_from_target = command.gripper_from_target
    msg.source = int(command.source)
    return msg


def joint_state_msg(
    state: RobotState,
    stamp: Time,
    joint_names: Sequence[str] = PIPER_JOINT_NAMES,
    gripper_name: str = GRIPPER_JOINT_NAME,
) -> JointState:
    """``JointState`` of the six arm joints (rad) and the gripper opening (m), positions only."""
    if len(joint_names) != 6:
        raise ValueError(f"joint_names: expected 6 names, got {list(joint_names)!r}")
    msg = JointState()
    msg.header.stamp = stamp
    msg.name = [*joint_names, gripper_name]
    msg.position = [float(v) for v in state.joint_positions_rad] + [float(state.gripper_width_m)]
    return msg


def ee_pose_msg(state: RobotState, stamp: Time, frame_id: str) -> PoseStamped:
    """``PoseStamped`` of the flange in ``frame_id`` (m; quaternion from the reported rpy)."""
    msg = PoseStamped()
    msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    p = msg.pose.position
    p.x, p.y, p.z = (float(v) for v in state.ee_position_m)
    o = msg.pose.orientation
    o.x, o.y, o.z, o.w = rpy_to_quat_xyzw(state.ee_rpy_rad)
    return msg


def pose_from_msg(msg: PoseStamped) -> tuple[np.ndarray, np.ndarray]:
    """(position (3,) m, rpy (3,) rad) of an EE pose message (what a policy node needs)."""
    p, o = msg.pose.position, msg.pose.orientation
    return np.array([p.x, p.y, p.z]), quat_xyzw_to_rpy((o.x, o.y, o.z, o.w))


# --- diagnostics ---------------------------------------------------------------------------
def json_values(values: Sequence[float]) -> str:
    """Numbers as a JSON list (full precision), for diagnostic values."""
    return json.dumps([float(v) for v in values])


def key_values(values: Mapping[str, object]) -> list[KeyValue]:
    """Diagnostic key/values from a mapping (values as ``str()``)."""
    return [KeyValue(key=k, value=str(v)) for k, v in values.items()]


def fault_message(state: RobotState) -> str:
    """One line naming what is wrong with the arm; a silent bus is always "CAN lost: ..."."""
    if state.faults & CAN_FAULTS:
        return f"CAN lost: {state.detail}"
    names = ", ".join(sorted(f.value for f in state.faults))
    return f"arm fault ({names}): {state.detail}"


def arm_state_diagnostic(state: RobotState) -> tuple[bytes, str, dict[str, str]]:
    """(level, message, values) of the arm: ERROR on any fault, WARN with motors off."""
    values = {
        "arm_status": state.arm_status.name,
        "motors_enabled": "".join("1" if m else "0" for m in state.motors_enabled),
        "gripper_enabled": str(state.gripper_enabled),
        "motion_done": str(state.motion_done),
        "faults": ",".join(sorted(f.value for f in state.faults)),
        "detail": state.detail,
        "joint_positions_rad": json_values(state.joint_positions_rad),
        "gripper_width_m": f"{state.gripper_width_m:.6f}",
        "ee_position_m": json_values(state.ee_position_m),
        "ee_rpy_rad": json_values(state.ee_rpy_rad),
    }
    if state.faults:
        return DiagnosticStatus.ERROR, fault_message(state), values
    if not state.enabled:
        return DiagnosticStatus.WARN, "motors disabled: call ~/enable", values
    return DiagnosticStatus.OK, "arm ok", values


def controller_diagnostic_level(status: ControllerStatus, detail: str) -> tuple[bytes, str]:
    """(level, message) of a controller status: latched faults ERROR, holds and off WARN."""
    if status in (ControllerStatus.FAULT, ControllerStatus.ESTOP):
        return DiagnosticStatus.ERROR, f"{status.value}: {detail}; holding"
    if status == ControllerStatus.WATCHDOG_HOLD:
        return DiagnosticStatus.WARN, f"watchdog_hold: {detail}; holding"
    if status == ControllerStatus.DISABLED:
        return DiagnosticStatus.WARN, "disabled: motors off, nothing is sent"
    if status == ControllerStatus.NOT_STARTED:
        return DiagnosticStatus.WARN, "not started"
    return DiagnosticStatus.OK, status.value


__all__ = [
    "CAN_FAULTS",
    "arm_state_diagnostic",
    "controller_diagnostic_level",
    "fault_message",
    "json_values",
    "key_values",
    "GRIPPER_JOINT_NAME",
    "PIPER_JOINT_NAMES",
    "ee_command_from_msg",
    "ee_command_to_msg",
    "ee_pose_msg",
    "joint_state_msg",
    "pose_from_msg",
    "seconds_to_stamp",
    "stamp_to_seconds",
]
