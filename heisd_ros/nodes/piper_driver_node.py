r"""The PIPER driver node: EE commands in, joint states and EE pose out, over piper_sdk (CAN).

A thin adapter over :class:`heisd_ros.robot.controller.RobotController` on a
:class:`heisd_ros.robot.piper.PiperRobot`: it converts messages, calls the library and turns
what comes back (never an exception) into topics, diagnostics, log lines and service answers.
Stopping never cuts motor power (a PIPER drops its arm when disabled): the watchdog, faults and
SDK errors all *hold* the last commanded pose.

Usage::

    # the real arm (CAN adapter up: sudo ip link set can0 up type can bitrate 1000000)
    ros2 run heisd_ros piper_driver_node --ros-args \
        --params-file $(ros2 pkg prefix heisd_ros)/share/heisd_ros/config/piper_driver_node.yaml \
        -p can_channel:=can0
    ros2 service call /piper_driver_node/enable std_srvs/srv/Trigger   # motors on, when ready

    # a dry run without hardware: an emulated PIPER in this process, on python-can's virtual
    # bus, driven by the unmodified piper_sdk (starts disabled, like the arm)
    ros2 run heisd_ros piper_driver_node --ros-args --params-file ... \
        -p emulate:=true -p interface:=virtual -p enable_on_start:=true

Interface:
    ``/heisd/ee_command`` (heisd_ros/msg/EECommand, in): one command per control step ->
        ``RobotController.step``. Deltas become absolute targets inside the workspace box and
        per-step limits; NaN, foreign frames, repeated step indices and unknown enum numbers
        are refused with the reason on /diagnostics; a gripper change is executed only when
        ``gripper_from_target`` is true on ``gripper.hysteresis_steps`` consecutive commands.
    ``/joint_states`` (sensor_msgs/JointState, out): joint1..joint6 in rad, then ``gripper``
        (the opening in m); ``/ee_pose`` (geometry_msgs/PoseStamped, out): the flange in
        ``frame_id``, m and quaternion. Both are published for every new feedback frame, at
        most ``feedback_rate_hz`` (the PIPER streams feedback at 200 Hz), stamped with this
        node's clock; nothing is published while the arm is silent (CAN lost).
    ``/diagnostics`` (diagnostic_msgs/DiagnosticArray, out): ``<node>: arm`` (CAN link, arm
        status code, motors, faults: collision, joint limits, CAN lost, ...), ``<node>:
        controller`` (running / watchdog_hold / gripper_wait / disabled / fault / estop,
        gripper state and phase, the last refused command and why, clamps, SDK errors) and,
        with ``emulate``, ``<node>: emulated arm`` (the emulator's ground truth).
    ``~/enable``, ``~/disable`` (the answer warns that the arm drops), ``~/estop``,
        ``~/clear_fault`` (std_srvs/Trigger).
    Only with ``emulate:=true`` (fault injection for dry runs and tests):
    ``~/emulator/set_can_link`` (std_srvs/SetBool; false = the cable is pulled: no frames in
        either direction), ``~/emulator/inject_collision`` (std_srvs/Trigger, joint 1) and
        ``~/emulator/clear_faults`` (std_srvs/Trigger: clears injected faults and the
        emergency stop; unlike the real arm's reset it leaves the motors enabled).

A PIPER that does not answer at start (no power, CAN down) does not stop the node: it reports
the reason and retries every ``reconnect_period_s``. A lost bus later on is a latched FAULT
(hold) until ``~/clear_fault`` after the bus is back. Invalid parameters are reported the same
way; the node then drives nothing. Stopping the node (Ctrl-C, SIGTERM) closes the CAN port
and leaves the motors as they are: an enabled arm keeps holding its last target.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import can
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from geometry_msgs.msg import PoseStamped
from rcl_interfaces.msg import ParameterDescriptor
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.node import Node
from sensor_msgs.msg import JointState
from std_srvs.srv import SetBool, Trigger

from heisd_ros.msg import EECommand as EECommandMsg
from heisd_ros.nodes._params import dataclass_from_parameters, declare_dataclass_parameters
from heisd_ros.nodes._spin import spin_node
from heisd_ros.nodes.robot_msgs import (
    CAN_FAULTS,
    GRIPPER_JOINT_NAME,
    PIPER_JOINT_NAMES,
    arm_state_diagnostic,
    controller_diagnostic_level,
    ee_command_from_msg,
    ee_pose_msg,
    fault_message,
    joint_state_msg,
    json_values,
    key_values,
)
from heisd_ros.robot.base import Robot, RobotError, RobotState
from heisd_ros.robot.controller import (
    ControllerConfig,
    ControllerStatus,
    RobotController,
    StepResult,
)
from heisd_ros.robot.emulated_piper import EmulatedPiper, EmulatedPiperConfig
from heisd_ros.robot.gripper import GripperConfig, GripperStateMachine
from heisd_ros.robot.piper import PiperConfig, PiperRobot
from heisd_ros.robot.safety import SafetyConfig, SafetyFilter

T = TypeVar("T")
RobotFactory = Callable[[PiperConfig], Robot]

#: What piper_sdk / python-can raise on a broken bus or a disconnected robot.
SDK_ERRORS = (RobotError, can.CanError, OSError)
#: An SDK error keeps the controller diagnostic at ERROR for this long, in s.
SDK_ERROR_REPORT_S = 5.0
_LATCHED = (ControllerStatus.FAULT, ControllerStatus.ESTOP)
_DISABLE_WARNING = "WARNING: a PIPER without motor power drops its arm: support it before disabling"


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
        reconnect_period_s: retry connecting to a silent arm (and starting the controller)
            this often, s.
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
    frame_id: str = "base_link"
    joint_names: tuple[str, ...] = PIPER_JOINT_NAMES
    gripper_joint_name: str = GRIPPER_JOINT_NAME

    def __post_init__(self) -> None:
        for name in (
            "feedback_rate_hz",
            "control_rate_hz",
            "diagnostics_period_s",
            "reconnect_period_s",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name}: expected a finite value > 0, got {value!r}")
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


class PiperDriverNode(Node):
    """Drives one PIPER from ``/heisd/ee_command``; publishes its state; never drops the arm."""

    def __init__(
        self,
        node_name: str = "piper_driver_node",
        *,
        robot_factory: RobotFactory = PiperRobot,
        **kwargs,
    ) -> None:
        """Declare parameters, build the controller (and emulator), start publishing.

        Connecting happens in the first control tick, so the node is on the graph (services,
        diagnostics) even while the arm is silent.

        Args:
            node_name: default node name (remappable with ``__node:=``).
            robot_factory: builds the :class:`Robot` from the arm settings (tests may pass
                another backend).
            **kwargs: passed to :class:`rclpy.node.Node` (``context``,
                ``parameter_overrides``, ...).
        """
        super().__init__(node_name, **kwargs)
        self.config = PiperDriverConfig()
        self.piper_config: PiperConfig | None = None
        self.emulator: EmulatedPiper | None = None
        self._controller: RobotController | None = None
        self._config_error = ""
        self._connect_error = ""
        self._start_error = ""
        self._enable_error = ""
        self._sdk_error, self._sdk_error_at = "", -math.inf
        self._next_attempt = 0.0
        self._enable_pending = False
        self._last_result: StepResult | None = None
        self._last_state: RobotState | None = None
        self._published_stamp: float | None = None
        self._counts: Counter[str] = Counter()
        self._last_outcome = ("", "")  # (what happened to the last command, why)
        self._last_clamped = ""
        try:
            self._configure(robot_factory)
        except ValueError as exc:
            self._config_error = f"piper driver not configured: {exc}"
            self.get_logger().error(self._config_error)

        cfg = self.config
        # The controller and the robot's command side are touched from one group only; the
        # feedback side (observe + publish) runs beside it so holding never delays /joint_states.
        self._control_group = MutuallyExclusiveCallbackGroup()
        self._feedback_group = MutuallyExclusiveCallbackGroup()
        self._joint_pub = self.create_publisher(JointState, "/joint_states", 10)
        self._pose_pub = self.create_publisher(PoseStamped, "/ee_pose", 10)
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.create_subscription(
            EECommandMsg,
            "/heisd/ee_command",
            self._on_command,
            10,
            callback_group=self._control_group,
        )
        for name, handler in (
            ("~/enable", self._on_enable),
            ("~/disable", self._on_disable),
            ("~/estop", self._on_estop),
            ("~/clear_fault", self._on_clear_fault),
        ):
            self.create_service(Trigger, name, handler, callback_group=self._control_group)
        self.create_timer(
            1.0 / cfg.control_rate_hz, self._on_control, callback_group=self._control_group
        )
        self.create_timer(
            1.0 / cfg.feedback_rate_hz, self._on_feedback, callback_group=self._feedback_group
        )
        self.create_timer(
            cfg.diagnostics_period_s,
            self._publish_diagnostics,
            callback_group=self._feedback_group,
        )
        if self.emulator is not None:
            self._create_emulator_services()

    # ------------------------------------------------------------------ configuration
    def _configure(self, robot_factory: RobotFactory) -> None:
        """Read every parameter into its config; build the emulator, robot and controller."""
        self.config = cfg = dataclass_from_parameters(self, PiperDriverConfig)
        # The node's own parameters fill the fields the component configs share with it.
        self.piper_config = _config_from_parameters(
            self,
            PiperConfig,
            "piper",
            can_channel=cfg.can_channel,
            interface=cfg.interface,
            enable_on_connect=False,  # the node enables after connecting (enable_on_start)
        )
        safety = _config_from_parameters(self, SafetyConfig, "safety", frame_id=cfg.frame_id)
        gripper = dataclass_from_parameters(self, GripperConfig, "gripper")
        # ControllerConfig's only field is optional (None = off), which a ROS parameter
        # cannot hold: 0 stands for None.
        tracking = self.declare_parameter(
            "controller.max_tracking_error_m",
            0.10,
            ParameterDescriptor(
                description="FAULT when the flange is farther than this from the commanded "
                "position, m (0 disables the check)",
                read_only=True,
                dynamic_typing=True,
            ),
        ).value
        if isinstance(tracking, bool) or not isinstance(tracking, (int, float)):
            raise ValueError(f"controller.max_tracking_error_m: expected metres, got {tracking!r}")
        try:
            controller = ControllerConfig(max_tracking_error_m=float(tracking) or None)
        except ValueError as exc:
            raise ValueError(f"invalid 'controller.*' parameters: {exc}") from exc
        if cfg.emulate:
            emulator_config = _config_from_parameters(
                self,
                EmulatedPiperConfig,
                "emulator",
                channel=cfg.can_channel,
                interface="virtual",
                dh_is_offset=self.piper_config.dh_is_offset,
            )
            self.emulator = EmulatedPiper(emulator_config).start()
            self.get_logger().info(
                f"emulate: an emulated PIPER runs in this process on virtual CAN "
                f"'{cfg.can_channel}' (no hardware is driven)"
            )
        self._controller = RobotController(
            robot_factory(self.piper_config),
            SafetyFilter(safety),
            GripperStateMachine(gripper),
            controller,
        )
        self._enable_pending = cfg.enable_on_start

    # ------------------------------------------------------------------ life cycle
    def _started(self, now: float) -> bool:
        """Connect, enable (when configured) and start the controller; True once started."""
        ctl = self._controller
        if ctl is None:
            return False
        if ctl.status != ControllerStatus.NOT_STARTED:
            return True
        if now < self._next_attempt:
            return False
        self._next_attempt = now + self.config.reconnect_period_s
        robot = ctl.robot
        if not robot.is_connected:
            try:
                robot.connect()
            except SDK_ERRORS as exc:
                reason = f"CAN: cannot connect to the PIPER: {exc}"
                if reason != self._connect_error:
                    self.get_logger().error(
                        f"{reason}; retrying every {self.config.reconnect_period_s:g} s"
                    )
                self._connect_error = reason
                return False
            self._connect_error = ""
            self.get_logger().info(
                f"connected to the PIPER on '{self.config.can_channel}' ({self.config.interface})"
            )
        if self._enable_pending:
            self._enable_pending = False  # once: a later failure is reported, not retried
            self._enable()
        try:
            result = ctl.start(now)
        except (ValueError, *SDK_ERRORS) as exc:  # ValueError: the EE is outside the box
            reason = f"controller not started: {exc}"
            if reason != self._start_error:
                self.get_logger().error(reason)
            self._start_error = reason
            return False
        self._start_error = ""
        self._note(result)
        return True

    def _enable(self) -> str:
        """Enable the motors; returns "" or the reason it failed (also logged)."""
        try:
            self._controller.robot.enable()
        except SDK_ERRORS as exc:
            self._enable_error = f"enable failed: {exc}"
            self.get_logger().error(self._enable_error)
            return self._enable_error
        self._enable_error = ""
        self.get_logger().info("motors enabled")
        return ""

    def _not_ready(self) -> str:
        """Why no command can be executed yet ("" when the controller runs)."""
        if self._config_error:
            return self._config_error
        ctl = self._controller
        if ctl is not None and ctl.status != ControllerStatus.NOT_STARTED:
            return ""
        return self._connect_error or self._start_error or "connecting to the PIPER"

    def destroy_node(self) -> None:
        """Close the CAN connection (motors keep their state: no drop), stop the emulator."""
        if self._controller is not None:
            self._controller.robot.disconnect()
        if self.emulator is not None:
            self.emulator.stop()
        super().destroy_node()

    # ------------------------------------------------------------------ control side
    def _call(self, what: str, fn: Callable[[], T]) -> T | None:
        """Run one library call; an SDK error is reported and answered with a hold."""
        try:
            return fn()
        except SDK_ERRORS as exc:
            self._sdk_error = f"{what}: {type(exc).__name__}: {exc}"
            self._sdk_error_at = time.monotonic()
            self.get_logger().error(
                f"SDK error in {self._sdk_error}; holding", throttle_duration_sec=5.0
            )
            try:
                self._controller.robot.hold()
            except SDK_ERRORS:
                pass  # the bus is gone; the arm keeps its own last target
            return None

    def _on_control(self) -> None:
        now = time.monotonic()
        if self._started(now):
            result = self._call("tick", lambda: self._controller.tick(now))
            if result is not None:
                self._note(result)

    def _note(self, result: StepResult) -> None:
        """Keep the newest result for diagnostics; log status changes and a silent bus."""
        before = self._last_result.status if self._last_result is not None else None
        self._last_result = result
        log = self.get_logger()
        if result.state is not None and result.state.faults & CAN_FAULTS:
            log.error(
                f"{fault_message(result.state)}; holding (motors stay enabled)",
                throttle_duration_sec=5.0,
            )
        if result.status == before:
            return
        detail = result.detail
        if result.status == ControllerStatus.DISABLED and not detail:
            detail = "motors off, nothing is sent (~/enable)"
        text = f"controller {result.status.value}" + (f": {detail}" if detail else "")
        if result.status in _LATCHED:
            log.error(text + "; holding, ~/clear_fault once the cause is gone")
        elif result.status in (ControllerStatus.WATCHDOG_HOLD, ControllerStatus.DISABLED):
            log.warning(text)
        else:
            log.info(text)

    def _on_command(self, msg: EECommandMsg) -> None:
        self._counts["received"] += 1
        try:
            command = ee_command_from_msg(msg)
        except ValueError as exc:
            self._refuse(msg.step_index, f"malformed EECommand: {exc}")
            return
        if reason := self._not_ready():
            self._refuse(command.step_index, f"driver not ready: {reason}")
            return
        now = time.monotonic()
        result = self._call("step", lambda: self._controller.step(command, now))
        if result is None:
            self._refuse(command.step_index, f"SDK error: {self._sdk_error}")
            return
        self._note(result)
        if result.sent is not None and result.sent.gripper_width_m is not None:
            self._counts["gripper_changes"] += 1
        if result.rejected_reason:
            waiting = result.rejected_reason == "arm waits for the gripper"
            self._refuse(command.step_index, result.rejected_reason, quiet=waiting)
            return
        self._counts["executed"] += 1
        self._last_outcome = (f"step {command.step_index}: executed", "")
        if result.clamped:
            self._counts["clamped"] += 1
            self._last_clamped = f"step {command.step_index}: {', '.join(result.clamped)}"
            self.get_logger().info(
                f"EECommand clamped: {self._last_clamped}", throttle_duration_sec=2.0
            )

    def _refuse(self, step_index: int, reason: str, quiet: bool = False) -> None:
        self._counts["waited" if quiet else "rejected"] += 1
        outcome = "arm waited" if quiet else "rejected"
        self._last_outcome = (f"step {step_index}: {outcome}", reason)
        if not quiet:
            self.get_logger().warning(
                f"EECommand step {step_index} not executed: {reason}", throttle_duration_sec=2.0
            )

    # ------------------------------------------------------------------ services
    def _on_enable(self, _request: Trigger.Request, response: Trigger.Response):
        if reason := self._connected_or_reason():
            response.success, response.message = False, reason
            return response
        if error := self._enable():
            response.success, response.message = False, error
            return response
        now = time.monotonic()
        self._next_attempt = 0.0
        if self._started(now):  # DISABLED -> RUNNING from the measured pose, right away
            result = self._call("tick", lambda: self._controller.tick(now))
            if result is not None:
                self._note(result)
        status = self._controller.status.value
        response.success, response.message = True, f"motors enabled; controller {status}"
        return response

    def _on_disable(self, _request: Trigger.Request, response: Trigger.Response):
        if reason := self._connected_or_reason():
            response.success, response.message = False, reason
            return response
        try:
            self._controller.robot.disable()
        except SDK_ERRORS as exc:
            response.success, response.message = False, f"disable failed: {exc}"
            return response
        self.get_logger().warning("motors disabled on request: " + _DISABLE_WARNING)
        response.success = True
        response.message = f"motors disabled. {_DISABLE_WARNING}. Re-enable with ~/enable."
        return response

    def _on_estop(self, _request: Trigger.Request, response: Trigger.Response):
        if reason := self._connected_or_reason():
            response.success, response.message = False, reason
            return response
        result = self._call("estop", self._controller.estop)
        if result is None:
            response.success, response.message = False, f"estop not sent: {self._sdk_error}"
            return response
        self._note(result)
        response.success = True
        response.message = (
            "emergency stop sent to the arm; commands are refused until the arm is reset "
            "(its own reset, 0x150=0x02, cuts motor power: support the arm), then "
            "~/clear_fault and ~/enable"
        )
        return response

    def _on_clear_fault(self, _request: Trigger.Request, response: Trigger.Response):
        if reason := self._not_ready():
            response.success, response.message = False, reason
            return response
        try:
            result = self._call(
                "clear_fault", lambda: self._controller.clear_fault(time.monotonic())
            )
        except ValueError as exc:  # re-synced from a pose outside the workspace box
            response.success, response.message = False, f"fault not cleared: {exc}"
            return response
        if result is None:
            response.success, response.message = False, self._sdk_error
            return response
        self._note(result)
        if result.status in _LATCHED:
            response.success = False
            response.message = result.rejected_reason or result.detail or result.status.value
            return response
        self._sdk_error, self._sdk_error_at = "", -math.inf
        response.success = True
        response.message = f"fault cleared; controller {result.status.value}"
        return response

    def _connected_or_reason(self) -> str:
        if self._config_error:
            return self._config_error
        if not self._controller.robot.is_connected:
            return self._connect_error or "not connected to the PIPER yet"
        return ""

    # ------------------------------------------------------------------ emulator hooks
    def _create_emulator_services(self) -> None:
        group = MutuallyExclusiveCallbackGroup()  # the emulator has its own lock
        self.create_service(
            SetBool, "~/emulator/set_can_link", self._on_set_can_link, callback_group=group
        )
        self.create_service(
            Trigger,
            "~/emulator/inject_collision",
            self._emulator_trigger(lambda emu: emu.inject_collision(1), "collision on joint 1"),
            callback_group=group,
        )
        self.create_service(
            Trigger,
            "~/emulator/clear_faults",
            self._emulator_trigger(
                lambda emu: emu.clear_faults(), "emulated faults and emergency stop cleared"
            ),
            callback_group=group,
        )

    def _on_set_can_link(self, request: SetBool.Request, response: SetBool.Response):
        self.emulator.set_can_link(request.data)
        response.success = True
        response.message = (
            "emulated CAN link up" if request.data else "emulated CAN link cut (cable pulled)"
        )
        self.get_logger().warning(f"emulator: {response.message}")
        return response

    def _emulator_trigger(self, action: Callable[[EmulatedPiper], None], what: str):
        def handler(_request: Trigger.Request, response: Trigger.Response):
            action(self.emulator)
            self.get_logger().warning(f"emulator: {what}")
            response.success, response.message = True, what
            return response

        return handler

    # ------------------------------------------------------------------ feedback side
    def _on_feedback(self) -> None:
        ctl = self._controller
        if ctl is None or not ctl.robot.is_connected:
            return
        try:
            state = ctl.robot.observe()
        except RobotError:
            return  # disconnected meanwhile (shutdown)
        self._last_state = state
        if state.stamp_s == self._published_stamp:
            return  # no new feedback frame: nothing new to say (and nothing while CAN is lost)
        self._published_stamp = state.stamp_s
        stamp = self.get_clock().now().to_msg()
        cfg = self.config
        self._joint_pub.publish(
            joint_state_msg(state, stamp, cfg.joint_names, cfg.gripper_joint_name)
        )
        self._pose_pub.publish(ee_pose_msg(state, stamp, cfg.frame_id))
        self._counts["feedback_published"] += 1

    def _publish_diagnostics(self) -> None:
        msg = DiagnosticArray(status=[self.arm_diagnostic(), self.controller_diagnostic()])
        if self.emulator is not None:
            msg.status.append(self.emulator_diagnostic())
        msg.header.stamp = self.get_clock().now().to_msg()
        self._diag_pub.publish(msg)

    def _status(self, what: str, level: bytes, message: str, values: dict) -> DiagnosticStatus:
        return DiagnosticStatus(
            level=level,
            name=f"{self.get_name()}: {what}",
            message=message,
            hardware_id=f"piper:{self.config.interface}:{self.config.can_channel}",
            values=key_values(values),
        )

    def arm_diagnostic(self) -> DiagnosticStatus:
        """CAN link, arm status code, motors, faults and the measured pose."""
        cfg, ctl, state = self.config, self._controller, self._last_state
        connected = ctl is not None and ctl.robot.is_connected
        values = {
            "can_channel": cfg.can_channel,
            "interface": cfg.interface,
            "emulated": cfg.emulate,
            "connected": connected,
            "enable_error": self._enable_error,
        }
        if self._config_error:
            return self._status("arm", DiagnosticStatus.ERROR, self._config_error, values)
        if not connected or state is None:
            message = self._connect_error or "CAN: connecting to the PIPER"
            return self._status("arm", DiagnosticStatus.ERROR, message, values)
        level, message, arm_values = arm_state_diagnostic(state)
        values.update(arm_values, feedback_published=self._counts["feedback_published"])
        return self._status("arm", level, message, values)

    def controller_diagnostic(self) -> DiagnosticStatus:
        """Controller status, gripper, the last command's fate, clamps and SDK errors."""
        ctl, result = self._controller, self._last_result
        counts = {
            f"commands_{k}": self._counts[k]
            for k in ("received", "executed", "rejected", "clamped", "waited", "gripper_changes")
        }
        outcome, reason = self._last_outcome
        sdk_recent = time.monotonic() - self._sdk_error_at < SDK_ERROR_REPORT_S
        values = {
            "status": ctl.status.value if ctl is not None else "unconfigured",
            "gripper": ctl.gripper.state.name.lower() if ctl is not None else "",
            "gripper_phase": ctl.gripper.phase.value if ctl is not None else "",
            "gripper_last_done": ctl.gripper.last_done_reason.value if ctl is not None else "",
            "detail": result.detail if result is not None else "",
            "faults": ",".join(sorted(f.value for f in result.faults)) if result else "",
            "last_command": outcome,
            "last_rejected_reason": reason,
            "last_clamped": self._last_clamped,
            "sdk_error": self._sdk_error if sdk_recent else "",
            **counts,
        }
        if ctl is not None:
            values["watchdog_timeout_s"] = ctl.safety.config.watchdog_timeout_s
        status = ctl.status if ctl is not None else None
        if not_ready := self._not_ready():
            connecting = not_ready == "connecting to the PIPER"
            level = DiagnosticStatus.WARN if connecting else DiagnosticStatus.ERROR
            return self._status("controller", level, not_ready, values)
        level, message = controller_diagnostic_level(status, values["detail"])
        if sdk_recent and status not in _LATCHED:
            level, message = DiagnosticStatus.ERROR, f"SDK error: {self._sdk_error}; holding"
        elif level == DiagnosticStatus.OK and reason and outcome.endswith("rejected"):
            level, message = DiagnosticStatus.WARN, f"{outcome}: {reason}"
        return self._status("controller", level, message, values)

    def emulator_diagnostic(self) -> DiagnosticStatus:
        """The emulated arm's ground truth (what it *is*, not what it reports over CAN)."""
        truth = self.emulator.state()
        frames = {f"frames[0x{k:03X}]": n for k, n in sorted(truth.frames_received.items())}
        values = {
            "arm_status": truth.arm_status.name,
            "can_link_up": truth.can_link_up,
            "motors_enabled": "".join("1" if m else "0" for m in truth.motors_enabled),
            "joints_rad": json_values(truth.joints_rad),
            "ee_position_m": json_values(truth.ee_position_m),
            "ee_rpy_rad": json_values(truth.ee_rpy_rad),
            "ee_target_m": "" if truth.ee_target_m is None else json_values(truth.ee_target_m),
            "gripper_width_m": repr(truth.gripper_width_m),
            "gripper_target_m": ""
            if truth.gripper_target_m is None
            else repr(truth.gripper_target_m),
            **frames,
        }
        return self._status("emulated arm", DiagnosticStatus.OK, "emulator running", values)


def _config_from_parameters(node: Node, cls: type[T], prefix: str, **fixed) -> T:
    """Declare ``cls``'s fields as ``<prefix>.*`` parameters except ``fixed``; build it."""
    values = declare_dataclass_parameters(node, cls, prefix, skip=tuple(fixed))
    try:
        return cls(**values, **fixed)
    except ValueError as exc:
        raise ValueError(f"invalid '{prefix}.*' parameters: {exc}") from exc


def main(args: list[str] | None = None) -> None:
    """Run the node until Ctrl-C (SIGINT), SIGTERM or ROS shutdown."""
    # Two threads: control (commands, tick, services) beside feedback + diagnostics.
    spin_node(PiperDriverNode, args, num_threads=2)


if __name__ == "__main__":
    main()
