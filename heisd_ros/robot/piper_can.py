"""The PIPER CAN protocol (V2) as far as this package speaks it: ids, units, frame layouts.

Learned from piper_sdk 0.6.2: ids from ``piper_msgs/msg_v2/can_id.py``, byte layouts and
signedness from ``protocol/protocol_v2/piper_protocol_v2.py`` (``DecodeMessage`` /
``EncodeMessage``), status bits from ``piper_msgs/msg_v2/feedback/*.py``. All multi-byte
fields are big-endian. Standard 11-bit ids, 8 data bytes.
"""

from __future__ import annotations

import math
import struct

# --- units ----------------------------------------------------------------------------------
#: Positions (EE x/y/z, gripper opening) travel in 0.001 mm.
UNITS_PER_M = 1_000_000
#: Angles (EE rx/ry/rz, joints) travel in 0.001 degree.
UNITS_PER_RAD = 1000.0 * 180.0 / math.pi
#: Gripper effort travels in 0.001 N*m (0..5000).
UNITS_PER_NM = 1000

# --- feedback frames (arm -> host) -----------------------------------------------------------
ARM_STATUS = 0x2A1  # ctrl_mode, arm_status, mode_feed, teach, motion_status, traj_num, err_code(16)
END_POSE_XY = 0x2A2  # int32 X, int32 Y (0.001 mm)
END_POSE_Z_RX = 0x2A3  # int32 Z (0.001 mm), int32 RX (0.001 deg)
END_POSE_RY_RZ = 0x2A4  # int32 RY, int32 RZ (0.001 deg)
JOINT_FEEDBACK = (0x2A5, 0x2A6, 0x2A7)  # int32 pairs (J1,J2), (J3,J4), (J5,J6) in 0.001 deg
GRIPPER_FEEDBACK = 0x2A8  # int32 opening (0.001 mm), int16 effort (0.001 N*m), uint8 status
HIGH_SPEED_FEEDBACK = tuple(
    range(0x251, 0x257)
)  # int16 speed (0.001 rad/s), int16 current, int32 pos
LOW_SPEED_FEEDBACK = tuple(range(0x261, 0x267))  # uint16 V(0.1), int16 foc_temp, int8 motor_temp,
#                                                  uint8 foc_status, uint16 bus_current

# --- command frames (host -> arm) ------------------------------------------------------------
MOTION_CTRL_1 = 0x150  # byte0 emergency_stop: 0x01 stop, 0x02 resume/reset
MOTION_CTRL_2 = 0x151  # ctrl_mode, move_mode, speed %, mit_mode, residence, installation
END_POSE_CTRL = (0x152, 0x153, 0x154)  # same layout as END_POSE_* feedback
JOINT_CTRL = (0x155, 0x156, 0x157)  # same layout as JOINT_FEEDBACK
GRIPPER_CTRL = 0x159  # int32 opening, uint16 effort, uint8 code, uint8 set_zero
MOTOR_ENABLE = 0x471  # uint8 motor (1-6, 7 = all), uint8 flag (0x01 disable, 0x02 enable)

# --- field values ----------------------------------------------------------------------------
CTRL_MODE_STANDBY = 0x00
CTRL_MODE_CAN = 0x01
MOVE_P = 0x00  # EE target, joint-space path
MOVE_J = 0x01  # joint target
MOVE_L = 0x02  # EE target, straight-line path
ESTOP_STOP = 0x01
ESTOP_RESUME = 0x02
MOTOR_ALL = 7
ENABLE_FLAG_DISABLE = 0x01
ENABLE_FLAG_ENABLE = 0x02
GRIPPER_CODE_DISABLE = 0x00
GRIPPER_CODE_ENABLE = 0x01
GRIPPER_CODE_DISABLE_CLEAR = 0x02
GRIPPER_CODE_ENABLE_CLEAR = 0x03

# err_code (0x2A1 bytes 6-7, big-endian): bit j-1 = joint j communication error,
# bit 8+j-1 = joint j angle limit (``ArmMsgFeedbackStatus.err_code`` setter).
ERR_COMM_BIT0 = 0
ERR_LIMIT_BIT0 = 8

# Low-speed foc_status bits (``arm_feedback_low_spd.py``).
FOC_VOLTAGE_LOW = 1 << 0
FOC_MOTOR_OVERHEAT = 1 << 1
FOC_OVERCURRENT = 1 << 2
FOC_DRIVER_OVERHEAT = 1 << 3
FOC_COLLISION = 1 << 4
FOC_DRIVER_ERROR = 1 << 5
FOC_ENABLED = 1 << 6
FOC_STALL = 1 << 7
# Gripper status bits (``arm_feedback_gripper.py``): same as above except bit 4 = sensor
# error and bit 7 = homed.
GRIPPER_SENSOR_ERROR = 1 << 4
GRIPPER_HOMED = 1 << 7


def pack_i32_pair(a: int, b: int) -> bytes:
    """Two signed 32-bit big-endian ints (positions, angles)."""
    return struct.pack(">ii", a, b)


def unpack_i32_pair(data: bytes) -> tuple[int, int]:
    """Inverse of :func:`pack_i32_pair`."""
    return struct.unpack(">ii", bytes(data[:8]))


def pack_arm_status(
    ctrl_mode: int,
    arm_status: int,
    mode_feed: int,
    motion_status: int,
    err_code: int,
    teach_status: int = 0,
    trajectory_num: int = 0,
) -> bytes:
    """0x2A1: six status bytes, then the 16-bit err_code."""
    return struct.pack(
        ">BBBBBBH",
        ctrl_mode,
        arm_status,
        mode_feed,
        teach_status,
        motion_status,
        trajectory_num,
        err_code,
    )


def pack_gripper_feedback(opening_units: int, effort_units: int, status: int) -> bytes:
    """0x2A8: int32 opening (0.001 mm), int16 effort (0.001 N*m), uint8 status, pad."""
    return struct.pack(">ihBx", opening_units, effort_units, status)


def unpack_gripper_ctrl(data: bytes) -> tuple[int, int, int, int]:
    """-> (opening 0.001 mm, effort 0.001 N*m, code, set_zero)."""
    return struct.unpack(">iHBB", bytes(data[:8]))


def pack_high_speed(speed_units: int, current_units: int, pos_units: int) -> bytes:
    """0x251-0x256: int16 speed (0.001 rad/s), int16 current (0.001 A), int32 position."""
    return struct.pack(">hhi", speed_units, current_units, pos_units)


def pack_low_speed(
    voltage_dv: int, foc_temp_c: int, motor_temp_c: int, foc_status: int, bus_current_ma: int
) -> bytes:
    """0x261-0x266: uint16 0.1 V, int16 degC, int8 degC, uint8 foc_status, uint16 mA."""
    return struct.pack(">HhbBH", voltage_dv, foc_temp_c, motor_temp_c, foc_status, bus_current_ma)


def m_to_units(value_m: float) -> int:
    """Metres -> 0.001 mm."""
    return int(round(value_m * UNITS_PER_M))


def rad_to_units(value_rad: float) -> int:
    """Radians -> 0.001 degree."""
    return int(round(value_rad * UNITS_PER_RAD))
