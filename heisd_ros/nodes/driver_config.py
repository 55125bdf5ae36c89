"""Settings of the PIPER driver node, and its component configs read from ROS parameters.

The node's own fields live in :class:`PiperDriverConfig` (top-level parameters); the arm, the
safety filter, the gripper, the controller and the emulated arm keep their library configs,
declared as ``piper.*``, ``safety.*``, ``gripper.*``, ``controller.*`` and ``emulator.*``
parameters (``config/piper_driver_node.yaml``). Where the driver needs a rule the library
leaves off by default (the simulator shares the library configs), the driver's own default
differs: :data:`DRIVER_SAFETY_DEFAULTS` (speed limits) and the command age limits of
:func:`controller_config_from_parameters`. Every reader raises ``ValueError`` naming the
parameter group and the bad value; the node reports it and then drives nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeVar

from rcl_interfaces.msg import ParameterDescriptor
from rclpy.node import Node

from heisd_ros.nodes._params import declare_dataclass_parameters
from heisd_ros.nodes.robot_msgs import GRIPPER_JOINT_NAME, PIPER_JOINT_NAMES
from heisd_ros.robot.controller import ControllerConfig

T = TypeVar("T")

#: The driver's defaults for ``safety.*`` where the library's are "off" (for the simulator):
#: the released target moves at most 0.25 m/s and 1.5 rad/s. A 10 Hz policy taking full steps
#: (0.02 m, 0.15 rad) stays below both, so they bind only on bursts and faster streams.
DRIVER_SAFETY_DEFAULTS = {"max_linear_speed_m_s": 0.25, "max_angular_speed_rad_s": 1.5}
#: ``controller.max_command_age_s`` default, s: a 5-10 Hz policy on frames ~0.1-0.3 s old.
DEFAULT_MAX_COMMAND_AGE_S = 0.5
#: ``controller.max_command_future_s`` default, s: clock skew between policy and driver hosts.
DEFAULT_MAX_COMMAND_FUTURE_S = 0.1


@dataclass
class PiperDriverConfig:
    """Settings of the driver node itself (the arm, safety and gripper have their own).

    Attributes:
        can_channel: CAN interface of the arm (``can0``; any name on the virtual bus).
        interface: python-can interface: ``socketcan`` on a robot, ``virtual`` for dry runs.
        enable_on_start: enable the motors once connected; off by default, so starting the
            driver never stiffens or moves an arm by surprise (use ~/enable).
        emulate: start an emulated PIPER in this process on the virtual bus ``can_channel``
            (needs interface ``virtual``): a dry run of the whole driver without hardware.
        feedback_rate_hz: most /joint_states and /ee_pose per second, Hz; one per new
            feedback frame (the PIPER streams at 200 Hz).
        control_rate_hz: rate of the controller tick (watchdog, gripper, faults, hold), Hz.
        diagnostics_period_s: period of /diagnostics, s.
        reconnect_period_s: first wait before retrying a silent arm (connecting, starting the
            controller, reopening a CAN port whose feedback stopped), s; doubles per failure.
        reconnect_max_period_s: longest wait between those retries, s.
        frame_id: frame of /ee_pose; EE commands must be in it too ("" counts as it).
        joint_names: names of the six arm joints in /joint_states.
        gripper_joint_name: name of the gripper opening (m) in /joint_states.
    """

    can_channel: str = "can0"
    interface: str = "socketcan"
    enable_on_start: bool = False
    emulate: bool = False
    feedback_rate_hz: float = 200.0
    control_rate_hz: float = 50.0
    diagnostics_period_s: float = 0.5
    reconnect_period_s: float = 2.0
    reconnect_max_period_s: float = 16.0
    frame_id: str = "base_link"
    joint_names: tuple[str, ...] = PIPER_JOINT_NAMES
    gripper_joint_name: str = GRIPPER_JOINT_NAME

    def __post_init__(self) -> None:
        for name in (
            "feedback_rate_hz",
            "control_rate_hz",
            "diagnostics_period_s",
            "reconnect_period_s",
            "reconnect_max_period_s",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name}: expected a finite value > 0, got {value!r}")
        if self.reconnect_max_period_s < self.reconnect_period_s:
            raise ValueError(
                f"reconnect_max_period_s: expected >= reconnect_period_s "
                f"({self.reconnect_period_s}), got {self.reconnect_max_period_s}"
            )
        if self.control_rate_hz < 10:
            raise ValueError(
                f"control_rate_hz: the controller needs >= 10 Hz, got {self.control_rate_hz}"
            )
        if len(self.joint_names) != 6 or not all(self.joint_names):
            raise ValueError(f"joint_names: expected 6 names, got {list(self.joint_names)!r}")
        if not self.frame_id:
            raise ValueError("frame_id: expected a frame name like 'base_link', got ''")
        if self.emulate and self.interface != "virtual":
            raise ValueError(
                f"emulate: the in-process emulated arm runs on python-can's virtual bus; set "
                f"interface to 'virtual' (got {self.interface!r}). For a vcan dry run start "
                "`python -m heisd_ros.robot.emulated_piper --channel vcan0` and keep emulate "
                "false"
            )


def config_from_parameters(
    node: Node,
    cls: type[T],
    prefix: str,
    *,
    defaults: dict[str, object] | None = None,
    **fixed: object,
) -> T:
    """Declare ``cls``'s fields as ``<prefix>.*`` parameters except ``fixed``; build it.

    Args:
        node: the node that declares the parameters.
        cls: a self-checking config dataclass.
        prefix: parameter group, e.g. ``"safety"``.
        defaults: the driver's defaults where they differ from the library's.
        **fixed: fields the node fills itself (shared with its own parameters); not declared.

    Returns:
        The config built from the parameters and ``fixed``.

    Raises:
        ValueError: the config refused a value; the message names the parameter group.
    """
    values = declare_dataclass_parameters(node, cls, prefix, defaults=defaults, skip=tuple(fixed))
    try:
        return cls(**values, **fixed)
    except ValueError as exc:
        raise ValueError(f"invalid '{prefix}.*' parameters: {exc}") from exc


def controller_config_from_parameters(node: Node) -> ControllerConfig:
    """Declare the ``controller.*`` parameters and build the :class:`ControllerConfig`.

    ``max_tracking_error_m`` and ``max_command_age_s`` are optional (None = off), which a ROS
    parameter cannot hold: 0 stands for None. The command age check is on by default here
    (the library leaves it off for the simulator).

    Raises:
        ValueError: not a number, or refused by :class:`ControllerConfig`.
    """
    descriptions = {
        "max_tracking_error_m": (
            0.10,
            "FAULT when the flange is farther than this from the commanded position, m "
            "(0 disables the check)",
        ),
        "max_command_age_s": (
            DEFAULT_MAX_COMMAND_AGE_S,
            "refuse commands stamped (observation time) longer ago than this, s; unstamped "
            "commands (stamp 0) are refused too (0 disables the check)",
        ),
        "max_command_future_s": (
            DEFAULT_MAX_COMMAND_FUTURE_S,
            "refuse commands stamped further ahead of this node's clock than this, s",
        ),
    }
    values = {}
    for name, (default, description) in descriptions.items():
        value = node.declare_parameter(
            f"controller.{name}",
            default,
            ParameterDescriptor(description=description, read_only=True, dynamic_typing=True),
        ).value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"controller.{name}: expected a number, got {value!r}")
        values[name] = float(value)
    try:
        return ControllerConfig(
            max_tracking_error_m=values["max_tracking_error_m"] or None,
            max_command_age_s=values["max_command_age_s"] or None,
            max_command_future_s=values["max_command_future_s"],
        )
    except ValueError as exc:
        raise ValueError(f"invalid 'controller.*' parameters: {exc}") from exc
