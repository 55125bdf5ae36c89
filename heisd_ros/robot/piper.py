"""The real AgileX PIPER behind :class:`~heisd_ros.robot.base.Robot`, on piper_sdk's V2 API.

Usage on a robot (CAN adapter up at 1 Mbit/s:
``sudo ip link set can0 up type can bitrate 1000000``)::

    with PiperRobot(PiperConfig(can_channel="can0", enable_on_connect=True)) as arm:
        state = arm.observe()
        arm.act(EETarget(state.ee_position_m + [0, 0, 0.01], state.ee_rpy_rad))

In tests the same class runs against :class:`~heisd_ros.robot.emulated_piper.EmulatedPiper` on
``interface="virtual"``. piper_sdk keeps one interface object per channel name for the whole
process, so use one channel name per arm (and per test).

A bus that dies under the driver (CAN adapter unplugged, interface deleted) is neither noticed
nor reopened by piper_sdk: its reader thread spins on the dead socket and every frame sent logs
an error. :meth:`PiperRobot.reopen` closes the port (stopping that thread) and opens it again
without waiting for the arm; the driver calls it with back-off while feedback is missing.
piper_sdk's log lines go to :mod:`heisd_ros.robot.piper_sdk_log` (counted, not printed).

Commands follow AgileX's own ROS driver (agilexrobotics/Piper_ros ``piper_ctrl_single_node.py``):
``MotionCtrl_2(0x01 CAN control, 0x00 MOVE P, speed %)`` then ``EndPoseCtrl`` in 0.001 mm /
0.001 deg; ``GripperCtrl(opening 0.001 mm, effort 0.001 N*m, 0x01 enable, 0)``; enabling
repeats ``EnableArm(7)`` until the six low-speed frames report their drivers enabled.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass

import numpy as np
from piper_sdk import C_PiperInterface_V2

from heisd_ros.geometry.rotations import wrap_angle
from heisd_ros.robot import piper_can as pc
from heisd_ros.robot.base import (
    ARM_STATUS_FAULTS,
    ArmStatus,
    EETarget,
    Robot,
    RobotError,
    RobotFault,
    RobotState,
)
from heisd_ros.robot.piper_kinematics import GRIPPER_RANGE_M
from heisd_ros.robot.piper_sdk_log import capture_sdk_log

_MOVE_MODES = {"p": pc.MOVE_P, "l": pc.MOVE_L}


@dataclass
class PiperConfig:
    """Settings of the PIPER backend.

    Attributes:
        can_channel: CAN interface name (``can0`` on a robot, any name on ``virtual``).
        interface: python-can interface: ``socketcan`` on a robot, ``virtual`` in tests.
        check_can_port: on socketcan, let piper_sdk check the port exists, is up, runs 1 Mbit/s.
        enable_on_connect: enable the motors in connect(); off by default, so starting the
            driver never moves or stiffens an arm by surprise.
        enable_timeout_s: how long enable() waits for all six drivers to report enabled.
        connect_timeout_s: how long connect() waits for the first feedback frame.
        stale_feedback_s: joint feedback older than this is reported as STALE_FEEDBACK.
        move_mode: ``"p"`` (MOVE P, joint-space path to the pose, AgileX's default for pose
            streaming) or ``"l"`` (MOVE L, straight line).
        speed_percent: MotionCtrl_2 speed, 1..100 % of the arm's maximum.
        gripper_effort_nm: gripping torque, 0..5 N*m.
        gripper_max_width_m: widest opening sent to the gripper.
        dh_is_offset: piper_sdk DH variant (1 for current firmware).
    """

    can_channel: str = "can0"
    interface: str = "socketcan"
    check_can_port: bool = True
    enable_on_connect: bool = False
    enable_timeout_s: float = 5.0
    connect_timeout_s: float = 3.0
    stale_feedback_s: float = 0.5
    move_mode: str = "p"
    speed_percent: int = 50
    gripper_effort_nm: float = 1.0
    gripper_max_width_m: float = GRIPPER_RANGE_M[1]
    dh_is_offset: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.can_channel, str) or not self.can_channel:
            raise ValueError(
                f"can_channel: expected a CAN interface name like 'can0', got {self.can_channel!r}"
            )
        if not isinstance(self.interface, str) or not self.interface:
            raise ValueError(
                f"interface: expected a python-can interface name, got {self.interface!r}"
            )
        for name in ("enable_timeout_s", "connect_timeout_s", "stale_feedback_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name}: expected seconds > 0, got {value!r}")
        if self.move_mode not in _MOVE_MODES:
            raise ValueError(
                f"move_mode: expected one of {sorted(_MOVE_MODES)}, got {self.move_mode!r}"
            )
        if (
            isinstance(self.speed_percent, bool)
            or not isinstance(self.speed_percent, int)
            or not 1 <= self.speed_percent <= 100
        ):
            raise ValueError(
                f"speed_percent: expected an int in 1..100, got {self.speed_percent!r}"
            )
        if not 0.0 <= self.gripper_effort_nm <= 5.0:
            raise ValueError(
                f"gripper_effort_nm: expected 0..5 N*m, got {self.gripper_effort_nm!r}"
            )
        if not 0.0 < self.gripper_max_width_m <= 0.1:
            raise ValueError(
                f"gripper_max_width_m: expected 0..0.1 m, got {self.gripper_max_width_m!r}"
            )
        if self.dh_is_offset not in (0, 1):
            raise ValueError(f"dh_is_offset: expected 0 or 1, got {self.dh_is_offset!r}")


class PiperRobot(Robot):
    """AgileX PIPER over CAN through ``piper_sdk.C_PiperInterface_V2``."""

    def __init__(self, config: PiperConfig) -> None:
        self.config = config
        self._sdk: C_PiperInterface_V2 | None = None
        self._tx_lock = threading.Lock()  # the SDK encodes every command through one shared message
        self._last_target: EETarget | None = None
        self._last_stamp = 0.0
        self._last_fresh = 0.0
        self._port_error = ""  # why the CAN port is closed while connected ("" = open)

    # --- connection ----------------------------------------------------------------------------
    @property
    def is_connected(self) -> bool:
        """True between connect() and disconnect()."""
        return self._sdk is not None

    def connect(self) -> None:
        """Open the CAN port, wait for complete feedback, enable when configured."""
        if self._sdk is not None:
            return
        cfg = self.config
        capture_sdk_log()  # before the SDK object exists: it logs from its constructor on
        sdk = C_PiperInterface_V2(
            can_name=cfg.can_channel,
            judge_flag=False,
            can_auto_init=False,
            dh_is_offset=cfg.dh_is_offset,
        )
        hint = self._hint()
        self._open_port(sdk)
        # Wait for fresh joint feedback and for the motor frames (enable bits, 0x261-0x266) so
        # the first observe() is complete. Stamps may be non-zero from an earlier connection:
        # piper_sdk keeps one interface object per channel.
        stamps_before = (sdk.GetArmJointMsgs().time_stamp, sdk.GetArmLowSpdInfoMsgs().time_stamp)
        sdk.ConnectPort()
        deadline = time.monotonic() + cfg.connect_timeout_s
        while (
            sdk.GetArmJointMsgs().time_stamp == stamps_before[0]
            or sdk.GetArmLowSpdInfoMsgs().time_stamp == stamps_before[1]
            or sdk.GetArmStatus().time_stamp == 0
        ):
            if time.monotonic() > deadline:
                sdk.DisconnectPort()
                raise RobotError(
                    f"no feedback from the PIPER on '{cfg.can_channel}' within "
                    f"{cfg.connect_timeout_s} s; {hint}"
                )
            time.sleep(0.01)
        self._sdk = sdk
        self._port_error = ""
        self._last_stamp = sdk.GetArmJointMsgs().time_stamp
        self._last_fresh = time.monotonic()
        self._last_target = None
        if cfg.enable_on_connect:
            self.enable()

    def reopen(self) -> None:
        """Close the CAN port and open it again, without waiting for the arm.

        For a bus that died under the driver: closing stops piper_sdk's reader thread (which
        spins on a dead socket), opening creates fresh python-can buses and restarts it. The
        last target is kept (holds re-send it once frames flow); feedback and observe()'s
        faults tell whether the arm answers.

        Raises:
            RobotError: the interface cannot be opened. The port stays closed: hold() sends
                nothing, act() raises, observe() reports CAN_LOST with the reason. Call again
                later.
        """
        sdk = self._require()
        with self._tx_lock:
            sdk.DisconnectPort()
            self._port_error = "CAN port closed for reopening"
            try:
                self._open_port(sdk)
            except RobotError as exc:
                self._port_error = str(exc)
                raise
            sdk.ConnectPort()
            self._port_error = ""

    def _open_port(self, sdk: C_PiperInterface_V2) -> None:
        """Create python-can buses for ``sdk``; RobotError with the SDK's reason when it fails."""
        cfg = self.config
        try:
            sdk.CreateCanBus(
                cfg.can_channel,
                bustype=cfg.interface,
                judge_flag=cfg.check_can_port and cfg.interface == "socketcan",
            )
        except ConnectionError as exc:
            # CreateCanBus raises from inside its own `except`: the context is the cause
            # (e.g. "CAN socket can0 does not exist.").
            cause = exc.__context__ or exc
            raise RobotError(
                f"cannot open CAN '{cfg.can_channel}' ({cfg.interface}): {cause}; {self._hint()}"
            ) from exc
        # piper_sdk swallows python-can's open error (C_STD_CAN.Init) and leaves no bus behind.
        can_port = sdk.GetCanBus()
        if (
            getattr(can_port, "recv_bus", None) is None
            or getattr(can_port, "send_bus", None) is None
        ):
            raise RobotError(
                f"cannot open CAN '{cfg.can_channel}' ({cfg.interface}); {self._hint()}"
            )

    def _hint(self) -> str:
        channel = self.config.can_channel
        return (
            f"check that the arm is powered and the CAN adapter is up "
            f"(`sudo ip link set {channel} up type can bitrate 1000000`)"
        )

    def disconnect(self) -> None:
        """Stop piper_sdk's reader and close the port (motors keep their state)."""
        if self._sdk is None:
            return
        sdk, self._sdk = self._sdk, None
        sdk.DisconnectPort()

    def _require(self) -> C_PiperInterface_V2:
        if self._sdk is None:
            raise RobotError(
                f"PiperRobot on '{self.config.can_channel}' is not connected: call connect() first"
            )
        return self._sdk

    # --- state ---------------------------------------------------------------------------------
    def observe(self) -> RobotState:
        """Latest feedback in SI units; faults include a lost or stale bus."""
        sdk = self._require()
        joints_msg = sdk.GetArmJointMsgs()
        status_msg = sdk.GetArmStatus().arm_status
        pose = sdk.GetArmEndPoseMsgs().end_pose
        gripper = sdk.GetArmGripperMsgs().gripper_state
        low = sdk.GetArmLowSpdInfoMsgs()
        motors = [getattr(low, f"motor_{i}") for i in range(1, 7)]
        js = joints_msg.joint_state

        now = time.monotonic()
        if joints_msg.time_stamp != self._last_stamp:
            self._last_stamp, self._last_fresh = joints_msg.time_stamp, now
        faults: set[RobotFault] = set()
        details: list[str] = []
        if self._port_error:
            faults.add(RobotFault.CAN_LOST)
            details.append(self._port_error)
        elif not sdk.isOk():
            faults.add(RobotFault.CAN_LOST)
            details.append(
                f"no CAN feedback on '{self.config.can_channel}' (piper_sdk isOk() is False)"
            )
        age = now - self._last_fresh
        if age > self.config.stale_feedback_s:
            faults.add(RobotFault.STALE_FEEDBACK)
            details.append(f"joint feedback is {age:.2f} s old")
        arm_status = _arm_status(status_msg)
        _arm_faults(arm_status, status_msg.err_status, motors, gripper, faults, details)

        return RobotState(
            stamp_s=float(joints_msg.time_stamp),
            joint_positions_rad=np.array(
                [js.joint_1, js.joint_2, js.joint_3, js.joint_4, js.joint_5, js.joint_6],
                dtype=np.float64,
            )
            / pc.UNITS_PER_RAD,
            gripper_width_m=gripper.grippers_angle / pc.UNITS_PER_M,
            ee_position_m=np.array([pose.X_axis, pose.Y_axis, pose.Z_axis], dtype=np.float64)
            / pc.UNITS_PER_M,
            ee_rpy_rad=np.array([pose.RX_axis, pose.RY_axis, pose.RZ_axis], dtype=np.float64)
            / pc.UNITS_PER_RAD,
            motors_enabled=tuple(bool(m.foc_status.driver_enable_status) for m in motors),
            arm_status=arm_status,
            motion_done=int(status_msg.motion_status) == 0,
            faults=frozenset(faults),
            detail="; ".join(details),
            gripper_enabled=bool(gripper.foc_status.driver_enable_status),
        )

    # --- commands ------------------------------------------------------------------------------
    def act(self, target: EETarget) -> None:
        """MotionCtrl_2 + EndPoseCtrl to ``target``; GripperCtrl when it carries a width."""
        sdk = self._require()
        with self._tx_lock:
            if self._port_error:
                raise RobotError(f"not sent: {self._port_error}")
            self._send_pose(sdk, target)
            if target.gripper_width_m is not None:
                self._send_gripper(sdk, target.gripper_width_m, pc.GRIPPER_CODE_ENABLE)
        self._last_target = EETarget(target.position_m, target.rpy_rad)

    def hold(self) -> None:
        """Re-send the last EE target; never disables the motors."""
        sdk = self._require()
        if self._last_target is None:
            return  # nothing commanded yet: the arm rests under its own controller
        with self._tx_lock:
            if self._port_error:
                return  # no port to send on; the arm keeps its own last target
            self._send_pose(sdk, self._last_target)

    @property
    def last_target(self) -> EETarget | None:
        """The last EE target sent (what hold() re-sends), or None."""
        return self._last_target

    def enable(self, timeout_s: float | None = None) -> None:
        """Enable the six joints and the gripper (at its current opening); wait for it."""
        sdk = self._require()
        timeout_s = self.config.enable_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        next_send = 0.0
        while not all(sdk.GetArmEnableStatus()):
            now = time.monotonic()
            if now > deadline:
                raise RobotError(
                    f"PIPER on '{self.config.can_channel}' did not report all motors enabled "
                    f"within {timeout_s} s (enabled: {sdk.GetArmEnableStatus()}); check the "
                    "emergency-stop button and the arm's power supply"
                )
            if now >= next_send:
                with self._tx_lock:
                    sdk.EnableArm(pc.MOTOR_ALL)
                    # Enable the gripper at its current opening, so enabling never moves it.
                    width = sdk.GetArmGripperMsgs().gripper_state.grippers_angle / pc.UNITS_PER_M
                    self._send_gripper(sdk, width, pc.GRIPPER_CODE_ENABLE)
                next_send = now + 0.25
            time.sleep(0.01)

    def disable(self) -> None:
        """Disable all motors. A PIPER drops its arm: support it first."""
        sdk = self._require()
        with self._tx_lock:
            sdk.DisableArm(pc.MOTOR_ALL)
            sdk.GripperCtrl(
                0,
                int(round(self.config.gripper_effort_nm * pc.UNITS_PER_NM)),
                pc.GRIPPER_CODE_DISABLE_CLEAR,
                0,
            )
        self._last_target = None

    def estop(self) -> None:
        """Emergency stop (0x150 = 0x01); recovery needs the arm reset and re-enable."""
        sdk = self._require()
        with self._tx_lock:
            sdk.EmergencyStop(pc.ESTOP_STOP)
        self._last_target = None  # never re-send an old target after an emergency stop

    # --- encoding ------------------------------------------------------------------------------
    def _send_pose(self, sdk: C_PiperInterface_V2, target: EETarget) -> None:
        cfg = self.config
        x, y, z = (pc.m_to_units(v) for v in target.position_m)
        rx, ry, rz = (pc.rad_to_units(wrap_angle(float(v))) for v in target.rpy_rad)
        sdk.MotionCtrl_2(pc.CTRL_MODE_CAN, _MOVE_MODES[cfg.move_mode], cfg.speed_percent, 0x00)
        sdk.EndPoseCtrl(x, y, z, rx, ry, rz)

    def _send_gripper(self, sdk: C_PiperInterface_V2, width_m: float, code: int) -> None:
        width = min(max(width_m, 0.0), self.config.gripper_max_width_m)
        sdk.GripperCtrl(
            pc.m_to_units(width),
            int(round(self.config.gripper_effort_nm * pc.UNITS_PER_NM)),
            code,
            0,
        )


def _arm_status(status_msg: object) -> ArmStatus:
    try:
        return ArmStatus(int(status_msg.arm_status))
    except ValueError:
        return ArmStatus.UNKNOWN


def _arm_faults(
    arm_status: ArmStatus,
    err: object,
    motors: list,
    gripper: object,
    faults: set[RobotFault],
    details: list[str],
) -> None:
    """Add the faults the arm reports to ``faults``/``details``.

    Sources, as piper_sdk decodes them: 0x2A1 status code and err_code bits
    (``ArmMsgFeedbackStatus.err_status``), 0x261-0x266 driver bits (``foc_status``), 0x2A8
    gripper status bits.
    """
    if arm_status in ARM_STATUS_FAULTS:
        faults.add(ARM_STATUS_FAULTS[arm_status])
        details.append(f"arm_status={arm_status.name}")
    limit = [j for j in range(1, 7) if getattr(err, f"joint_{j}_angle_limit")]
    comm = [j for j in range(1, 7) if getattr(err, f"communication_status_joint_{j}")]
    if limit:
        faults.add(RobotFault.JOINT_LIMIT)
        details.append(f"joint(s) {limit} past their angle limit")
    if comm:
        faults.add(RobotFault.JOINT_COMMUNICATION)
        details.append(f"joint(s) {comm} not communicating")
    for j, motor in enumerate(motors, start=1):
        foc = motor.foc_status
        if foc.collision_status:
            faults.add(RobotFault.COLLISION)
            details.append(f"collision protection on joint {j}")
        if (
            foc.driver_error_status
            or foc.driver_overcurrent
            or foc.voltage_too_low
            or foc.stall_status
        ):
            faults.add(RobotFault.DRIVER_ERROR)
            details.append(f"driver error on joint {j} (foc_status=0x{motor.foc_status_code:02X})")
        if foc.motor_overheating or foc.driver_overheating:
            faults.add(RobotFault.OVER_TEMPERATURE)
            details.append(f"over-temperature on joint {j}")
    gfoc = gripper.foc_status
    if (
        gfoc.driver_error_status
        or gfoc.sensor_status
        or gfoc.driver_overcurrent
        or gfoc.voltage_too_low
    ):
        faults.add(RobotFault.GRIPPER_ERROR)
        details.append(f"gripper error (status=0x{gripper.status_code:02X})")
