"""The robot seam: one command record, one state record and one abstract arm.

Every arm backend (the real PIPER on ``piper_sdk``, the MuJoCo sim, a replayed bag) implements
:class:`Robot`; the safety filter, the gripper state machine and the controller only ever talk
to this interface. Units are SI throughout: metres, radians, seconds.

:class:`EECommand` mirrors ``msg/EECommand.msg`` field for field with the same constant
numbers, so a node converts a message with ``EECommand(**fields)`` and nothing else.
"""

from __future__ import annotations

import enum
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np


class CommandMode(enum.IntEnum):
    """How an :class:`EECommand` is meant (``EECommand.MODE_*`` in the message)."""

    DELTA = 0  # relative to the last commanded EE pose (the VLA's action space)
    ABSOLUTE = 1  # absolute EE target pose in the command's frame


class GripperState(enum.IntEnum):
    """Binary gripper target (``EECommand.GRIPPER_*``); never a width."""

    OPEN = 0
    CLOSED = 1


class CommandSource(enum.IntEnum):
    """Who produced the arm part of a command (``EECommand.SOURCE_*``)."""

    AR = 0  # plain autoregressive decoding by the target VLA
    DRAFTER = 1  # drafter draft verified by the target VLA
    RETRIEVAL = 2  # retrieval draft verified by the target VLA
    RETRIEVAL_SKIP = 3  # retrieval draft executed without verification (verify-skip)
    SCRIPTED = 4  # scripted expert / teleoperation
    REPLAY = 5  # replayed from a recording


def _enum_field(name: str, enum_type: type[enum.IntEnum], value: object) -> enum.IntEnum:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name}: expected one of {[m.value for m in enum_type]}, got {value!r}")
    try:
        return enum_type(int(value))
    except ValueError:
        valid = ", ".join(f"{m.value}={m.name}" for m in enum_type)
        raise ValueError(f"{name}: {value!r} is not one of {valid}") from None


def _vec3(name: str, value: object) -> np.ndarray:
    try:
        arr = np.array(value, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected 3 numbers, got {value!r}") from None
    if arr.shape != (3,):
        raise ValueError(f"{name}: expected 3 numbers, got shape {arr.shape}")
    arr.flags.writeable = False
    return arr


@dataclass(frozen=True)
class EECommand:
    """One 7-DoF end-effector command, as ``msg/EECommand.msg`` carries it.

    Finiteness is deliberately *not* checked here: this record states what arrived on the
    wire, and the safety filter rejects non-finite commands with a reason the driver reports.

    Attributes:
        translation_m: (3,) metres, x/y/z in ``frame_id``.
        rotation_rad: (3,) radians, roll/pitch/yaw about the fixed x, y, z axes (extrinsic XYZ).
        gripper: binary target state.
        gripper_from_target: True only when the target VLA itself produced the gripper token
            this step; the strict gripper state machine acts on nothing else.
        mode: delta (relative to the last commanded pose) or absolute.
        source: who produced the arm part.
        step_index: control step (monotonic within a run).
        stamp_s: time of the observation the action was decided on, seconds.
        frame_id: frame the translation/rotation are expressed in.
    """

    translation_m: np.ndarray
    rotation_rad: np.ndarray
    gripper: GripperState = GripperState.OPEN
    gripper_from_target: bool = False
    mode: CommandMode = CommandMode.DELTA
    source: CommandSource = CommandSource.AR
    step_index: int = 0
    stamp_s: float = 0.0
    frame_id: str = "base_link"

    # The message's constants, so node code can write EECommand.MODE_DELTA like the .msg.
    MODE_DELTA = CommandMode.DELTA
    MODE_ABSOLUTE = CommandMode.ABSOLUTE
    GRIPPER_OPEN = GripperState.OPEN
    GRIPPER_CLOSED = GripperState.CLOSED
    SOURCE_AR = CommandSource.AR
    SOURCE_DRAFTER = CommandSource.DRAFTER
    SOURCE_RETRIEVAL = CommandSource.RETRIEVAL
    SOURCE_RETRIEVAL_SKIP = CommandSource.RETRIEVAL_SKIP
    SOURCE_SCRIPTED = CommandSource.SCRIPTED
    SOURCE_REPLAY = CommandSource.REPLAY

    def __post_init__(self) -> None:
        object.__setattr__(self, "translation_m", _vec3("translation_m", self.translation_m))
        object.__setattr__(self, "rotation_rad", _vec3("rotation_rad", self.rotation_rad))
        object.__setattr__(self, "gripper", _enum_field("gripper", GripperState, self.gripper))
        object.__setattr__(self, "mode", _enum_field("mode", CommandMode, self.mode))
        object.__setattr__(self, "source", _enum_field("source", CommandSource, self.source))
        if not isinstance(self.gripper_from_target, (bool, np.bool_)):
            raise ValueError(
                f"gripper_from_target: expected a bool, got {self.gripper_from_target!r}"
            )
        object.__setattr__(self, "gripper_from_target", bool(self.gripper_from_target))
        if (
            isinstance(self.step_index, bool)
            or not isinstance(self.step_index, (int, np.integer))
            or self.step_index < 0
        ):
            raise ValueError(f"step_index: expected a non-negative int, got {self.step_index!r}")
        object.__setattr__(self, "step_index", int(self.step_index))
        if not isinstance(self.stamp_s, (int, float)) or not math.isfinite(self.stamp_s):
            raise ValueError(f"stamp_s: expected a finite time in seconds, got {self.stamp_s!r}")
        if not isinstance(self.frame_id, str):
            raise ValueError(f"frame_id: expected a string, got {self.frame_id!r}")

    @property
    def is_finite(self) -> bool:
        """True when every number of the arm part is finite."""
        return bool(
            np.all(np.isfinite(self.translation_m)) and np.all(np.isfinite(self.rotation_rad))
        )


@dataclass(frozen=True)
class EETarget:
    """An absolute target a :class:`Robot` executes: EE pose plus an optional gripper width.

    Attributes:
        position_m: (3,) EE position in the robot base frame, metres.
        rpy_rad: (3,) EE orientation, roll/pitch/yaw about fixed x, y, z (extrinsic XYZ).
        gripper_width_m: opening between the fingers in metres, or None to leave the gripper.
    """

    position_m: np.ndarray
    rpy_rad: np.ndarray
    gripper_width_m: float | None = None

    def __post_init__(self) -> None:
        position = _vec3("position_m", self.position_m)
        rpy = _vec3("rpy_rad", self.rpy_rad)
        if not (np.all(np.isfinite(position)) and np.all(np.isfinite(rpy))):
            raise ValueError(f"EETarget: pose must be finite, got {position} / {rpy}")
        object.__setattr__(self, "position_m", position)
        object.__setattr__(self, "rpy_rad", rpy)
        if self.gripper_width_m is not None:
            width = float(self.gripper_width_m)
            if not math.isfinite(width) or width < 0.0:
                raise ValueError(f"gripper_width_m: expected a finite width >= 0, got {width}")
            object.__setattr__(self, "gripper_width_m", width)


class ArmStatus(enum.IntEnum):
    """The arm controller's status code (PIPER 0x2A1 byte 1; other backends map onto it)."""

    NORMAL = 0x00
    EMERGENCY_STOP = 0x01
    NO_SOLUTION = 0x02
    SINGULARITY = 0x03
    TARGET_EXCEEDS_LIMIT = 0x04
    JOINT_COMMUNICATION_ERROR = 0x05
    JOINT_BRAKE_NOT_RELEASED = 0x06
    COLLISION = 0x07
    TEACH_DRAG_OVERSPEED = 0x08
    JOINT_STATUS_ERROR = 0x09
    OTHER_ERROR = 0x0A
    TEACH_RECORD = 0x0B
    TEACH_EXECUTE = 0x0C
    TEACH_PAUSE = 0x0D
    CONTROLLER_OVER_TEMPERATURE = 0x0E
    RESISTOR_OVER_TEMPERATURE = 0x0F
    UNKNOWN = 0xFF


class RobotFault(str, enum.Enum):
    """Reasons a robot is not safe to drive; the string values go into status messages."""

    CAN_LOST = "can_lost"  # no feedback frames at all (bus down, cable out, arm off)
    STALE_FEEDBACK = "stale_feedback"  # feedback older than the configured limit
    EMERGENCY_STOP = "emergency_stop"
    COLLISION = "collision"
    JOINT_LIMIT = "joint_limit"
    JOINT_COMMUNICATION = "joint_communication"
    UNREACHABLE_TARGET = "unreachable_target"  # no IK solution or singularity
    DRIVER_ERROR = "driver_error"
    OVER_TEMPERATURE = "over_temperature"
    TEACH_MODE = "teach_mode"  # the arm runs a teach program, not our commands
    GRIPPER_ERROR = "gripper_error"


#: Arm status codes and the fault each one means (NORMAL maps to none).
ARM_STATUS_FAULTS: dict[ArmStatus, RobotFault] = {
    ArmStatus.EMERGENCY_STOP: RobotFault.EMERGENCY_STOP,
    ArmStatus.NO_SOLUTION: RobotFault.UNREACHABLE_TARGET,
    ArmStatus.SINGULARITY: RobotFault.UNREACHABLE_TARGET,
    ArmStatus.TARGET_EXCEEDS_LIMIT: RobotFault.JOINT_LIMIT,
    ArmStatus.JOINT_COMMUNICATION_ERROR: RobotFault.JOINT_COMMUNICATION,
    ArmStatus.JOINT_BRAKE_NOT_RELEASED: RobotFault.DRIVER_ERROR,
    ArmStatus.COLLISION: RobotFault.COLLISION,
    ArmStatus.TEACH_DRAG_OVERSPEED: RobotFault.TEACH_MODE,
    ArmStatus.JOINT_STATUS_ERROR: RobotFault.DRIVER_ERROR,
    ArmStatus.OTHER_ERROR: RobotFault.DRIVER_ERROR,
    ArmStatus.TEACH_RECORD: RobotFault.TEACH_MODE,
    ArmStatus.TEACH_EXECUTE: RobotFault.TEACH_MODE,
    ArmStatus.TEACH_PAUSE: RobotFault.TEACH_MODE,
    ArmStatus.CONTROLLER_OVER_TEMPERATURE: RobotFault.OVER_TEMPERATURE,
    ArmStatus.RESISTOR_OVER_TEMPERATURE: RobotFault.OVER_TEMPERATURE,
    ArmStatus.UNKNOWN: RobotFault.DRIVER_ERROR,
}


def _frozen_array(name: str, value: object, size: int) -> np.ndarray:
    arr = np.array(value, dtype=np.float64).reshape(-1)
    if arr.shape != (size,):
        raise ValueError(f"{name}: expected {size} values, got shape {arr.shape}")
    arr.flags.writeable = False
    return arr


@dataclass(frozen=True)
class RobotState:
    """What a robot reports at one instant, in SI units.

    Attributes:
        stamp_s: time of the newest feedback frame behind this state, seconds (wall clock).
        joint_positions_rad: (6,) arm joint angles.
        gripper_width_m: opening between the fingers.
        ee_position_m: (3,) flange position in the base frame, as the arm reports it.
        ee_rpy_rad: (3,) flange roll/pitch/yaw (extrinsic XYZ), as the arm reports it.
        motors_enabled: per arm joint motor, True when its driver is enabled.
        arm_status: the arm controller's status code.
        motion_done: True when the arm reports it reached its last target.
        faults: everything that makes the arm unsafe to drive right now; empty when fine.
        detail: human-readable explanation of the faults (which joint, which bit).
        gripper_enabled: True when the gripper driver is enabled.
    """

    stamp_s: float
    joint_positions_rad: np.ndarray
    gripper_width_m: float
    ee_position_m: np.ndarray
    ee_rpy_rad: np.ndarray
    motors_enabled: tuple[bool, ...] = (False,) * 6
    arm_status: ArmStatus = ArmStatus.NORMAL
    motion_done: bool = True
    faults: frozenset[RobotFault] = field(default_factory=frozenset)
    detail: str = ""
    gripper_enabled: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "joint_positions_rad",
            _frozen_array("joint_positions_rad", self.joint_positions_rad, 6),
        )
        object.__setattr__(
            self, "ee_position_m", _frozen_array("ee_position_m", self.ee_position_m, 3)
        )
        object.__setattr__(self, "ee_rpy_rad", _frozen_array("ee_rpy_rad", self.ee_rpy_rad, 3))
        if len(self.motors_enabled) != 6:
            raise ValueError(f"motors_enabled: expected 6 flags, got {self.motors_enabled!r}")
        object.__setattr__(self, "motors_enabled", tuple(bool(x) for x in self.motors_enabled))
        object.__setattr__(self, "faults", frozenset(RobotFault(f) for f in self.faults))

    @property
    def ok(self) -> bool:
        """True when no fault is reported."""
        return not self.faults

    @property
    def enabled(self) -> bool:
        """True when all six arm motors are enabled."""
        return all(self.motors_enabled)

    @property
    def ee_target(self) -> EETarget:
        """The measured EE pose as a target (what "stay here" means)."""
        return EETarget(self.ee_position_m, self.ee_rpy_rad)


class RobotError(RuntimeError):
    """A robot operation failed; the message says what to check."""


class Robot(ABC):
    """One arm behind connect / observe / act / disconnect.

    Contract for implementations:

    - ``act`` takes an *absolute* target; deltas are turned into targets by the safety filter
      before they reach a robot.
    - ``hold`` keeps the arm where it was last told to be (re-sends the last target); it never
      disables motors (a PIPER drops its arm when disabled).
    - ``observe`` never raises for arm faults or a lost bus: those come back as
      ``RobotState.faults``. It raises :class:`RobotError` only when called while disconnected.
    """

    @abstractmethod
    def connect(self) -> None:
        """Open the connection; raise :class:`RobotError` with a hint when the arm is silent."""

    @abstractmethod
    def disconnect(self) -> None:
        """Close the connection; safe to call twice."""

    @property
    @abstractmethod
    def is_connected(self) -> bool:
        """True between connect() and disconnect()."""

    def reopen(self) -> None:
        """Re-open a connection whose feedback stopped; raise RobotError when it fails.

        A driver calls it with back-off while the arm is silent. This default disconnects
        and connects again; backends that can reopen their transport without waiting for the
        arm (:class:`~heisd_ros.robot.piper.PiperRobot`) override it.
        """
        self.disconnect()
        self.connect()

    @abstractmethod
    def observe(self) -> RobotState:
        """Latest state in SI units, with faults."""

    @abstractmethod
    def act(self, target: EETarget) -> None:
        """Send one absolute EE target (and the gripper width when given)."""

    @abstractmethod
    def hold(self) -> None:
        """Keep the arm at its last commanded target; no-op when nothing was commanded."""

    @abstractmethod
    def enable(self, timeout_s: float | None = None) -> None:
        """Enable all motors; raise :class:`RobotError` when they do not report enabled."""

    @abstractmethod
    def disable(self) -> None:
        """Disable all motors. The arm may fall: call only when it is supported."""

    @abstractmethod
    def estop(self) -> None:
        """Emergency stop through the arm's own controller."""

    def __enter__(self) -> Robot:
        self.connect()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.disconnect()
