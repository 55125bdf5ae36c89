"""An emulated AgileX PIPER arm: the CAN side of the arm, on any python-can bus.

It streams the feedback frames piper_sdk parses and executes the command frames piper_sdk
sends, so the *unmodified* SDK (and :class:`heisd_ros.robot.piper.PiperRobot` on top of it)
can be driven without hardware: in tests on python-can's in-process ``virtual`` bus, in dry
runs on a ``vcan`` interface::

    sudo ip link add dev vcan0 type vcan && sudo ip link set up vcan0
    python -m heisd_ros.robot.emulated_piper --channel vcan0 --interface socketcan

Model (kinematic, no dynamics, no gravity):

- EE targets (MOVE P / MOVE L): the flange moves in a straight line and slerps its orientation
  at speed-limited rates; joints follow through a damped-least-squares IK on piper_sdk's DH
  table (best effort: the EE pose is the truth, any target is reached).
- Joint targets (MOVE J): joints move at a speed limit; the EE pose is their FK.
- The gripper moves at a speed limit toward its commanded opening; an object placed with
  :meth:`EmulatedPiper.place_object` stops it (a stall, as on an object).
- Motion happens only in CAN control mode, with all six motors enabled and no fault; the
  emergency stop (0x150 = 0x01) freezes the arm, resume (0x150 = 0x02) clears faults and
  disables the motors as a real PIPER does.

Fault injection: :meth:`inject_collision`, :meth:`inject_joint_limit`,
:meth:`inject_joint_communication_error`, :meth:`set_can_link` (False = the bus goes silent
in both directions, as with a pulled cable).
"""

from __future__ import annotations

import argparse
import math
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import can
import numpy as np

from heisd_ros.geometry.rotations import (
    matrix_to_rotvec,
    matrix_to_rpy,
    rotvec_to_matrix,
    rpy_to_matrix,
)
from heisd_ros.robot import piper_can as pc
from heisd_ros.robot.base import ArmStatus
from heisd_ros.robot.piper_kinematics import GRIPPER_RANGE_M, JOINT_LIMITS_RAD, PiperKinematics


@dataclass
class EmulatedPiperConfig:
    """Settings of an emulated PIPER.

    Attributes:
        channel: python-can channel (any hashable name on ``virtual``; e.g. ``vcan0``).
        interface: python-can interface, ``virtual`` in tests, ``socketcan`` on a vcan.
        feedback_rate_hz: rate of status, end-pose, joint and gripper frames (0x2A1-0x2A8).
        high_speed_rate_hz: rate of motor high-speed frames (0x251-0x256); 0 disables them.
        low_speed_rate_hz: rate of motor low-speed frames (0x261-0x266, enable/fault bits).
        max_linear_speed_m_s: EE speed at 100 % speed (MotionCtrl_2 byte 2 scales it).
        max_angular_speed_rad_s: EE rotation speed at 100 %.
        max_joint_speed_rad_s: joint speed at 100 % (MOVE J).
        gripper_speed_m_s: gripper opening speed.
        gripper_max_width_m: widest opening; commands are clipped to it.
        initial_joints_rad: joint angles at start-up.
        initial_gripper_width_m: gripper opening at start-up.
        start_enabled: motors (and gripper) enabled at start-up.
        dh_is_offset: piper_sdk DH variant (1 for current firmware).
        ik_iterations_per_tick: DLS iterations per feedback tick while the EE moves.
    """

    channel: str
    interface: str = "virtual"
    feedback_rate_hz: float = 200.0
    high_speed_rate_hz: float = 100.0
    low_speed_rate_hz: float = 20.0
    max_linear_speed_m_s: float = 0.25
    max_angular_speed_rad_s: float = 1.5
    max_joint_speed_rad_s: float = 2.0
    gripper_speed_m_s: float = 0.1
    gripper_max_width_m: float = GRIPPER_RANGE_M[1]
    initial_joints_rad: tuple[float, ...] = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    initial_gripper_width_m: float = 0.0
    start_enabled: bool = False
    dh_is_offset: int = 1
    ik_iterations_per_tick: int = 3

    def __post_init__(self) -> None:
        if not self.channel:
            raise ValueError(f"channel: expected a non-empty channel name, got {self.channel!r}")
        for name in (
            "feedback_rate_hz",
            "low_speed_rate_hz",
            "max_linear_speed_m_s",
            "max_angular_speed_rad_s",
            "max_joint_speed_rad_s",
            "gripper_speed_m_s",
            "gripper_max_width_m",
        ):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name}: expected a finite value > 0, got {value!r}")
        if not (0 <= self.high_speed_rate_hz <= self.feedback_rate_hz):
            raise ValueError(
                f"high_speed_rate_hz: expected 0..feedback_rate_hz, got {self.high_speed_rate_hz}"
            )
        if self.low_speed_rate_hz > self.feedback_rate_hz:
            raise ValueError(
                f"low_speed_rate_hz: expected <= feedback_rate_hz, got {self.low_speed_rate_hz}"
            )
        joints = np.asarray(self.initial_joints_rad, dtype=np.float64)
        if (
            joints.shape != (6,)
            or np.any(joints < JOINT_LIMITS_RAD[:, 0])
            or np.any(joints > JOINT_LIMITS_RAD[:, 1])
        ):
            raise ValueError(
                f"initial_joints_rad: expected 6 angles within the PIPER joint limits "
                f"{JOINT_LIMITS_RAD.tolist()}, got {self.initial_joints_rad!r}"
            )
        if not 0.0 <= self.initial_gripper_width_m <= self.gripper_max_width_m:
            raise ValueError(
                f"initial_gripper_width_m: expected 0..{self.gripper_max_width_m}, "
                f"got {self.initial_gripper_width_m}"
            )
        if self.ik_iterations_per_tick < 1:
            raise ValueError(
                f"ik_iterations_per_tick: expected >= 1, got {self.ik_iterations_per_tick}"
            )


@dataclass(frozen=True)
class EmulatedArmState:
    """A snapshot of the emulated arm, in SI units (what the arm *is*, not what it reports)."""

    joints_rad: np.ndarray
    ee_position_m: np.ndarray
    ee_rpy_rad: np.ndarray
    gripper_width_m: float
    motors_enabled: tuple[bool, ...]
    gripper_enabled: bool
    ctrl_mode: int
    move_mode: int
    speed_percent: int
    arm_status: ArmStatus
    err_code: int
    ee_target_m: np.ndarray | None
    gripper_target_m: float | None
    gripper_effort_nm: float
    can_link_up: bool
    frames_received: dict[int, int] = field(default_factory=dict)


class EmulatedPiper:
    """A thread that behaves like a PIPER's CAN side. Use as a context manager or start()/stop()."""

    def __init__(self, config: EmulatedPiperConfig) -> None:
        self.config = config
        self._kin = PiperKinematics(config.dh_is_offset)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bus: can.BusABC | None = None
        self._reset_state()

    # --- life cycle --------------------------------------------------------------------------
    def start(self) -> EmulatedPiper:
        """Open the bus and start streaming feedback."""
        if self._thread is not None:
            raise RuntimeError("EmulatedPiper already started")
        self._bus = can.Bus(interface=self.config.interface, channel=self.config.channel)
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"emulated-piper-{self.config.channel}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and close the bus; safe to call twice."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=2.0)
        self._thread = None
        if self._bus is not None:
            self._bus.shutdown()
            self._bus = None

    def __enter__(self) -> EmulatedPiper:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # --- inspection and fault injection --------------------------------------------------------
    def state(self) -> EmulatedArmState:
        """A consistent snapshot of the emulated arm."""
        with self._lock:
            return EmulatedArmState(
                joints_rad=self._q.copy(),
                ee_position_m=self._ee[:3, 3].copy(),
                ee_rpy_rad=matrix_to_rpy(self._ee[:3, :3]),
                gripper_width_m=self._gripper_width,
                motors_enabled=tuple(self._motors_enabled),
                gripper_enabled=self._gripper_enabled,
                ctrl_mode=self._ctrl_mode,
                move_mode=self._move_mode,
                speed_percent=self._speed_percent,
                arm_status=ArmStatus(self._arm_status),
                err_code=self._err_code,
                ee_target_m=None if self._ee_target is None else self._ee_target[:3, 3].copy(),
                gripper_target_m=self._gripper_target,
                gripper_effort_nm=self._gripper_effort_nm,
                can_link_up=self._link_up,
                frames_received=dict(self._frames_received),
            )

    def inject_collision(self, joint: int = 1) -> None:
        """The arm reports a collision (status 0x07, joint's foc collision bit) and stops."""
        with self._lock:
            self._check_joint(joint)
            self._collision_joints.add(joint)
            self._set_fault(ArmStatus.COLLISION)

    def inject_joint_limit(self, joint: int) -> None:
        """The arm reports joint ``joint`` (1-6) past its angle limit and stops."""
        with self._lock:
            self._check_joint(joint)
            self._err_code |= 1 << (pc.ERR_LIMIT_BIT0 + joint - 1)
            self._set_fault(ArmStatus.TARGET_EXCEEDS_LIMIT)

    def inject_joint_communication_error(self, joint: int) -> None:
        """The arm reports lost communication with joint ``joint`` (1-6) and stops."""
        with self._lock:
            self._check_joint(joint)
            self._err_code |= 1 << (pc.ERR_COMM_BIT0 + joint - 1)
            self._set_fault(ArmStatus.JOINT_COMMUNICATION_ERROR)

    def clear_faults(self) -> None:
        """Clear injected faults and the emergency stop (motors keep their enable state)."""
        with self._lock:
            self._collision_joints.clear()
            self._err_code = 0
            self._arm_status = ArmStatus.NORMAL

    def set_can_link(self, up: bool) -> None:
        """False: no feedback goes out and commands are dropped, as with a pulled CAN cable."""
        with self._lock:
            self._link_up = bool(up)

    def place_object(self, width_m: float | None) -> None:
        """Put an object of ``width_m`` between the fingers (None removes it)."""
        with self._lock:
            self._object_width = None if width_m is None else float(width_m)

    # --- internals -----------------------------------------------------------------------------
    @staticmethod
    def _check_joint(joint: int) -> None:
        if joint not in range(1, 7):
            raise ValueError(f"joint: expected 1..6, got {joint!r}")

    def _set_fault(self, status: ArmStatus) -> None:
        self._arm_status = status
        self._ee_target = None
        self._joint_target = None

    def _reset_state(self) -> None:
        cfg = self.config
        self._q = np.array(cfg.initial_joints_rad, dtype=np.float64)
        self._ee = self._kin.fk(self._q)
        self._ik_error = 0.0
        self._ik_retry = False
        self._q_prev = self._q.copy()
        self._motors_enabled = [cfg.start_enabled] * 6
        self._gripper_enabled = cfg.start_enabled
        self._gripper_width = float(cfg.initial_gripper_width_m)
        self._gripper_target: float | None = None
        self._gripper_effort_nm = 0.0
        self._object_width: float | None = None
        self._ctrl_mode = pc.CTRL_MODE_STANDBY
        self._move_mode = pc.MOVE_P
        self._speed_percent = 0
        self._arm_status = ArmStatus.NORMAL
        self._err_code = 0
        self._collision_joints: set[int] = set()
        self._ee_target: np.ndarray | None = None
        self._joint_target: np.ndarray | None = None
        self._ee_parts: dict[int, tuple[int, int]] = {}
        self._joint_parts: dict[int, tuple[int, int]] = {}
        self._link_up = True
        self._frames_received: Counter[int] = Counter()

    def _run(self) -> None:
        cfg = self.config
        period = 1.0 / cfg.feedback_rate_hz
        high_every = (
            0
            if cfg.high_speed_rate_hz == 0
            else max(1, round(cfg.feedback_rate_hz / cfg.high_speed_rate_hz))
        )
        low_every = max(1, round(cfg.feedback_rate_hz / cfg.low_speed_rate_hz))
        next_tick = last = time.perf_counter()
        tick = 0
        while not self._stop.is_set():
            msg = self._bus.recv(timeout=max(0.0, next_tick - time.perf_counter()))
            if msg is not None:
                with self._lock:
                    if self._link_up:
                        self._handle(msg)
            now = time.perf_counter()
            if now < next_tick:
                continue
            with self._lock:
                self._step(min(now - last, 0.05))
                frames = (
                    self._feedback(tick, high_every, low_every, now - last) if self._link_up else []
                )
            last = now
            for arbitration_id, data in frames:
                self._bus.send(
                    can.Message(arbitration_id=arbitration_id, data=data, is_extended_id=False)
                )
            tick += 1
            next_tick += period
            if next_tick < now:  # fell behind (loaded machine): skip, do not burst
                next_tick = now + period

    def _handle(self, msg: can.Message) -> None:
        """Execute one command frame (lock held)."""
        can_id, data = msg.arbitration_id, bytes(msg.data)
        self._frames_received[can_id] += 1
        if len(data) < 8:  # piper_sdk always sends 8 bytes; ignore foreign short frames
            return
        if can_id == pc.MOTION_CTRL_1:
            if data[0] == pc.ESTOP_STOP:
                self._set_fault(ArmStatus.EMERGENCY_STOP)
            elif data[0] == pc.ESTOP_RESUME:  # reset: clears errors, motors lose power
                self._collision_joints.clear()
                self._err_code = 0
                self._arm_status = ArmStatus.NORMAL
                self._motors_enabled = [False] * 6
                self._gripper_enabled = False
                self._ctrl_mode = pc.CTRL_MODE_STANDBY
                self._ee_target = self._joint_target = None
        elif can_id == pc.MOTION_CTRL_2:
            self._ctrl_mode, self._move_mode = data[0], data[1]
            self._speed_percent = min(100, data[2])
            if self._ctrl_mode != pc.CTRL_MODE_CAN:
                self._ee_target = self._joint_target = None
        elif can_id in pc.END_POSE_CTRL:
            self._ee_parts[can_id] = pc.unpack_i32_pair(data)
            # piper_sdk always sends 0x152, 0x153, 0x154 in order; the last one commits.
            if (
                can_id == pc.END_POSE_CTRL[2]
                and len(self._ee_parts) == 3
                and self._accepts_motion()
            ):
                (x, y), (z, rx), (ry, rz) = (self._ee_parts[i] for i in pc.END_POSE_CTRL)
                target = np.eye(4)
                target[:3, 3] = np.array([x, y, z]) / pc.UNITS_PER_M
                target[:3, :3] = rpy_to_matrix(np.array([rx, ry, rz]) / pc.UNITS_PER_RAD)
                if self._move_mode in (pc.MOVE_P, pc.MOVE_L):
                    self._ee_target, self._joint_target = target, None
            if can_id == pc.END_POSE_CTRL[2]:
                self._ee_parts.clear()
        elif can_id in pc.JOINT_CTRL:
            self._joint_parts[can_id] = pc.unpack_i32_pair(data)
            if (
                can_id == pc.JOINT_CTRL[2]
                and len(self._joint_parts) == 3
                and self._accepts_motion()
                and self._move_mode == pc.MOVE_J
            ):
                units = [v for i in pc.JOINT_CTRL for v in self._joint_parts[i]]
                target = np.array(units, dtype=np.float64) / pc.UNITS_PER_RAD
                self._joint_target = np.clip(target, JOINT_LIMITS_RAD[:, 0], JOINT_LIMITS_RAD[:, 1])
                self._ee_target = None
            if can_id == pc.JOINT_CTRL[2]:
                self._joint_parts.clear()
        elif can_id == pc.GRIPPER_CTRL:
            opening, effort, code, _set_zero = pc.unpack_gripper_ctrl(data)
            self._gripper_enabled = code in (pc.GRIPPER_CODE_ENABLE, pc.GRIPPER_CODE_ENABLE_CLEAR)
            if self._gripper_enabled:
                self._gripper_target = min(
                    max(opening / pc.UNITS_PER_M, 0.0), self.config.gripper_max_width_m
                )
                self._gripper_effort_nm = effort / pc.UNITS_PER_NM
        elif can_id == pc.MOTOR_ENABLE:
            motor, flag = data[0], data[1]
            enable = flag == pc.ENABLE_FLAG_ENABLE
            if flag in (pc.ENABLE_FLAG_ENABLE, pc.ENABLE_FLAG_DISABLE):
                if motor in (pc.MOTOR_ALL, 0xFF):
                    self._motors_enabled = [enable] * 6
                    self._gripper_enabled = enable
                elif 1 <= motor <= 6:
                    self._motors_enabled[motor - 1] = enable
        # Anything else (parameter queries, firmware read, ...) is counted and ignored.

    def _accepts_motion(self) -> bool:
        return (
            self._ctrl_mode == pc.CTRL_MODE_CAN
            and all(self._motors_enabled)
            and self._arm_status == ArmStatus.NORMAL
        )

    def _step(self, dt: float) -> None:
        """Advance the kinematic model by ``dt`` seconds (lock held)."""
        cfg = self.config
        self._q_prev = self._q.copy()
        rate = max(self._speed_percent, 1) / 100.0
        if self._accepts_motion() and self._ee_target is not None:
            moved = self._step_ee(dt, rate)
            if moved or self._ik_retry:
                previous = self._ik_error
                self._q, self._ik_error = self._kin.ik_step(
                    self._q, self._ee, cfg.ik_iterations_per_tick
                )
                # Keep iterating while it converges; give up on unreachable poses (the EE
                # pose stays the truth, the joints stay best effort).
                self._ik_retry = self._ik_error > 1e-6 and (
                    moved or self._ik_error < 0.99 * previous
                )
        elif self._accepts_motion() and self._joint_target is not None:
            delta = self._joint_target - self._q
            self._q = self._q + np.clip(
                delta, -cfg.max_joint_speed_rad_s * rate * dt, cfg.max_joint_speed_rad_s * rate * dt
            )
            self._ee = self._kin.fk(self._q)
        if self._gripper_enabled and self._gripper_target is not None:
            delta = self._gripper_target - self._gripper_width
            width = self._gripper_width + float(
                np.clip(delta, -cfg.gripper_speed_m_s * dt, cfg.gripper_speed_m_s * dt)
            )
            if self._object_width is not None and self._gripper_width >= self._object_width > width:
                width = self._object_width  # fingers stop on the object
            self._gripper_width = width

    def _step_ee(self, dt: float, rate: float) -> bool:
        cfg = self.config
        target = self._ee_target
        dp = target[:3, 3] - self._ee[:3, 3]
        dist = float(np.linalg.norm(dp))
        rotvec = matrix_to_rotvec(target[:3, :3] @ self._ee[:3, :3].T)
        angle = float(np.linalg.norm(rotvec))
        if dist < 1e-9 and angle < 1e-9:
            return False
        max_dp = cfg.max_linear_speed_m_s * rate * dt
        max_da = cfg.max_angular_speed_rad_s * rate * dt
        ee = self._ee.copy()
        ee[:3, 3] = target[:3, 3] if dist <= max_dp else ee[:3, 3] + dp * (max_dp / dist)
        if angle <= max_da:
            ee[:3, :3] = target[:3, :3]
        else:
            ee[:3, :3] = rotvec_to_matrix(rotvec * (max_da / angle)) @ ee[:3, :3]
        self._ee = ee
        return True

    def _motion_done(self) -> bool:
        if self._ee_target is not None:
            return bool(np.allclose(self._ee, self._ee_target, atol=1e-6))
        if self._joint_target is not None:
            return bool(np.allclose(self._q, self._joint_target, atol=1e-6))
        return True

    def _feedback(
        self, tick: int, high_every: int, low_every: int, dt: float
    ) -> list[tuple[int, bytes]]:
        """Frames for this tick (lock held)."""
        frames = [
            (
                pc.ARM_STATUS,
                pc.pack_arm_status(
                    self._ctrl_mode,
                    int(self._arm_status),
                    self._move_mode,
                    0 if self._motion_done() else 1,
                    self._err_code,
                ),
            )
        ]
        pos = [pc.m_to_units(v) for v in self._ee[:3, 3]]
        rpy = [pc.rad_to_units(v) for v in matrix_to_rpy(self._ee[:3, :3])]
        frames += [
            (pc.END_POSE_XY, pc.pack_i32_pair(pos[0], pos[1])),
            (pc.END_POSE_Z_RX, pc.pack_i32_pair(pos[2], rpy[0])),
            (pc.END_POSE_RY_RZ, pc.pack_i32_pair(rpy[1], rpy[2])),
        ]
        joints = [pc.rad_to_units(v) for v in self._q]
        frames += [
            (can_id, pc.pack_i32_pair(joints[2 * i], joints[2 * i + 1]))
            for i, can_id in enumerate(pc.JOINT_FEEDBACK)
        ]
        stalled = (
            self._object_width is not None
            and self._gripper_target is not None
            and self._gripper_width == self._object_width
            and self._gripper_target < self._object_width
        )
        effort = self._gripper_effort_nm if stalled else 0.0
        status = pc.GRIPPER_HOMED | (pc.FOC_ENABLED if self._gripper_enabled else 0)
        frames.append(
            (
                pc.GRIPPER_FEEDBACK,
                pc.pack_gripper_feedback(
                    pc.m_to_units(self._gripper_width), int(round(effort * pc.UNITS_PER_NM)), status
                ),
            )
        )
        if high_every and tick % high_every == 0:
            speed = (self._q - self._q_prev) / max(dt, 1e-6)
            for i, can_id in enumerate(pc.HIGH_SPEED_FEEDBACK):
                # Position sent in 0.001 rad: the SDK documents the field only as "rad".
                frames.append(
                    (
                        can_id,
                        pc.pack_high_speed(
                            int(np.clip(round(speed[i] * 1000), -32768, 32767)),
                            0,
                            int(round(self._q[i] * 1000)),
                        ),
                    )
                )
        if tick % low_every == 0:
            for i, can_id in enumerate(pc.LOW_SPEED_FEEDBACK):
                status = (pc.FOC_ENABLED if self._motors_enabled[i] else 0) | (
                    pc.FOC_COLLISION if (i + 1) in self._collision_joints else 0
                )
                frames.append((can_id, pc.pack_low_speed(240, 35, 30, status, 0)))
        return frames


def main(argv: list[str] | None = None) -> None:
    """Run an emulated PIPER until Ctrl-C (dry runs against a vcan interface)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--channel", default="vcan0")
    parser.add_argument("--interface", default="socketcan")
    parser.add_argument("--start-enabled", action="store_true")
    args = parser.parse_args(argv)
    config = EmulatedPiperConfig(
        channel=args.channel, interface=args.interface, start_enabled=args.start_enabled
    )
    with EmulatedPiper(config):
        try:
            while True:
                time.sleep(1.0)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()


__all__ = ["EmulatedArmState", "EmulatedPiper", "EmulatedPiperConfig"]
