"""Robot backends behind one interface: piper_sdk, simulated and replayed arms.

Pure parts (importable without piper_sdk or python-can):

- :mod:`.base`: :class:`EECommand` (mirrors ``msg/EECommand.msg``), :class:`EETarget`,
  :class:`RobotState`, :class:`RobotFault`, the abstract :class:`Robot`.
- :mod:`.command_stream`: step-index continuity (lost commands, a sender starting over) and
  command stamp age.
- :mod:`.safety`: :class:`SafetyFilter` (delta -> safe absolute target, workspace box, step
  and speed limits, lost-command re-anchoring, watchdog).
- :mod:`.gripper`: :class:`GripperStateMachine` (strict binary gripper, hysteresis, arm wait).
- :mod:`.controller`: :class:`RobotController` composing the three for a driver node.

Hardware parts (import them from their modules; they need piper_sdk / python-can):

- :mod:`.piper`: ``PiperRobot`` on ``piper_sdk.C_PiperInterface_V2``; :mod:`.piper_sdk_log`
  captures the SDK's log lines.
- :mod:`.emulated_piper`: ``EmulatedPiper``, the arm's CAN side for tests and dry runs.
"""

from heisd_ros.robot.base import (
    ArmStatus,
    CommandMode,
    CommandSource,
    EECommand,
    EETarget,
    GripperState,
    Robot,
    RobotError,
    RobotFault,
    RobotState,
)
from heisd_ros.robot.controller import (
    ControllerConfig,
    ControllerStatus,
    RobotController,
    StepResult,
)
from heisd_ros.robot.gripper import (
    GripperConfig,
    GripperDecision,
    GripperPhase,
    GripperStateMachine,
)
from heisd_ros.robot.safety import SafetyConfig, SafetyFilter, SafetyResult

__all__ = [
    "ArmStatus",
    "CommandMode",
    "CommandSource",
    "ControllerConfig",
    "ControllerStatus",
    "EECommand",
    "EETarget",
    "GripperConfig",
    "GripperDecision",
    "GripperPhase",
    "GripperState",
    "GripperStateMachine",
    "Robot",
    "RobotController",
    "RobotError",
    "RobotFault",
    "RobotState",
    "SafetyConfig",
    "SafetyFilter",
    "SafetyResult",
    "StepResult",
]
