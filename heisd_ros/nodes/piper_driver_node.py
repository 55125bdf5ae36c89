r"""The PIPER driver node: EE commands in, joint states and EE pose out, over piper_sdk (CAN).

A thin adapter over :class:`heisd_ros.robot.controller.RobotController` on a
:class:`heisd_ros.robot.piper.PiperRobot`: it converts messages, calls the library and turns
what comes back (never an exception) into topics, diagnostics, log lines and service answers.
Stopping never cuts motor power (a PIPER drops its arm when disabled): the watchdog, faults and
SDK errors all *hold* the last commanded pose. The parts: ``driver_config`` (parameters),
``driver_core`` (connect, enable, step, hold, service answers; no rclpy), ``driver_commander``
(the one-commander rule; no rclpy), ``driver_command_input`` (the command subscription,
claim/release services and commander look-up that apply it), ``driver_report`` (errors and
counters), ``driver_diagnostics`` (/diagnostics entries) and ``driver_emulator`` (fault
injection into the emulated arm).

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
        ``RobotController.step``, executed only when it comes from the *commander*: the
        publisher of the node ``commander.node_name`` (default ``policy_node`` in this node's
        namespace: the launch's ``/policy_node``), bound by node name and publisher GID
        (``driver_commander``). Commands from any other publisher are refused (never
        executed; the commander's stream goes on), counted per sending node on /diagnostics
        (``commands_foreign``, ``refused_publishers``) and logged once per node. When the
        commander's publisher leaves the ROS graph the arm holds at once (the watchdog would
        hold only after ``safety.watchdog_timeout_s``); its next publisher binds again.
        Subscription QoS: reliable, volatile, keep-last 10. Deltas
        must arrive complete and in order (reliable); a driver started late must never
        receive old commands (volatile); 10 is 0.5 s (``controller.max_command_age_s``) of a
        20 Hz stream, so a deeper queue would only hold commands the age check refuses, and a
        burst that overflows it shows up as lost step indices (below).
        Refused with the reason on /diagnostics (``last_rejected_reason``) and a throttled log
        line, the arm holding: commands whose ``header.stamp`` (the observation they were
        decided on) is older than ``controller.max_command_age_s`` on this node's clock,
        further in the future than ``controller.max_command_future_s``, or 0 (unstamped);
        NaN, foreign frames, repeated step indices and unknown enum numbers. A ``step_index``
        more than 1 ahead of the previous one means commands were lost: that command is
        refused and the target re-anchored to the measured pose (integration resumes with the
        next index; ``commands_lost`` counts the missing ones); a ``step_index`` that goes
        backwards is a sender that started over: re-anchored, then executed. Deltas become
        absolute targets inside the workspace box and the per-step limits; the target sent
        to the arm moves at most ``safety.max_linear_speed_m_s`` / ``max_angular_speed_rad_s``
        (released on commands and control ticks; a faster stream is slowed down, and motion
        more than one step ahead of the arm's target is dropped). A gripper change is
        executed only when ``gripper_from_target`` is true on ``gripper.hysteresis_steps``
        consecutive commands.
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
    ``~/claim_control``, ``~/release_control`` (heisd_ros/srv/ClaimControl): hand control to
        the node named in the request (a teleoperation or replay tool; refused with
        ``commander.allow_claim: false``), and back to ``commander.node_name``; the arm holds
        until the new commander's first command. The request names the node because a
        service callback cannot learn its caller; who may call these services is for SROS2
        permissions to restrict.
    ``~/enable``, ``~/disable`` (the answer warns that the arm drops), ``~/estop``,
        ``~/clear_fault`` (std_srvs/Trigger). ``~/enable`` answers failure, with the reason,
        while the arm cannot be reached (CAN lost), reports a fault, or the controller is in
        FAULT/ESTOP (``~/clear_fault`` first).
    Only with ``emulate:=true`` (fault injection for dry runs and tests):
    ``~/emulator/set_can_link`` (std_srvs/SetBool; false = the cable is pulled: no frames in
        either direction), ``~/emulator/inject_collision`` (std_srvs/Trigger, joint 1) and
        ``~/emulator/clear_faults`` (std_srvs/Trigger: clears injected faults and the
        emergency stop; unlike the real arm's reset it leaves the motors enabled).

A PIPER that does not answer at start (no power, no CAN interface) does not stop the node: it
reports the reason once and retries after ``reconnect_period_s``, doubling up to
``reconnect_max_period_s``. Lost feedback later on is a latched FAULT (hold); the node reopens
the CAN port at once and then with the same back-off (a bus that died under it, e.g. an
unplugged adapter, comes back without a restart; a port that cannot be opened stays closed, so
nothing spins on it), and ``~/clear_fault`` resumes once the feedback is back. piper_sdk's own
log lines (one per failed frame on a dead bus) are captured, not printed: a summary line at
most every 10 s, and ``sdk_log_lines`` / ``sdk_log_last`` on the arm diagnostic. Invalid
parameters are reported the same way; the node then drives nothing. Stopping the node (Ctrl-C,
SIGTERM) closes the CAN port and leaves the motors as they are: an enabled arm keeps holding
its last target.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from geometry_msgs.msg import PoseStamped
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.node import Node
from sensor_msgs.msg import JointState
from std_srvs.srv import Trigger

from heisd_ros.nodes import driver_diagnostics as diag
from heisd_ros.nodes._params import dataclass_from_parameters
from heisd_ros.nodes._spin import spin_node
from heisd_ros.nodes.driver_command_input import CommandInput
from heisd_ros.nodes.driver_commander import CommanderConfig, CommanderGate, resolve_node_name
from heisd_ros.nodes.driver_config import (
    DRIVER_SAFETY_DEFAULTS,
    PiperDriverConfig,
    config_from_parameters,
    controller_config_from_parameters,
)
from heisd_ros.nodes.driver_core import DriverCore
from heisd_ros.nodes.driver_emulator import create_emulator_services
from heisd_ros.nodes.driver_report import DriverReport
from heisd_ros.nodes.robot_msgs import ee_pose_msg, joint_state_msg
from heisd_ros.robot.base import Robot, RobotError, RobotState
from heisd_ros.robot.controller import RobotController
from heisd_ros.robot.emulated_piper import EmulatedPiper, EmulatedPiperConfig
from heisd_ros.robot.gripper import GripperConfig, GripperStateMachine
from heisd_ros.robot.piper import PiperConfig, PiperRobot
from heisd_ros.robot.piper_sdk_log import capture_sdk_log
from heisd_ros.robot.safety import SafetyConfig, SafetyFilter

__all__ = ["PiperDriverNode", "main"]

RobotFactory = Callable[[PiperConfig], Robot]


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
        self.commander_config = CommanderConfig()
        self.piper_config: PiperConfig | None = None
        self.emulator: EmulatedPiper | None = None
        #: Errors by stage, command counters and outcomes (the diagnostics read them).
        self.report = DriverReport()
        self._controller: RobotController | None = None
        self._last_state: RobotState | None = None
        self._published_stamp: float | None = None
        try:
            self._configure(robot_factory)
        except ValueError as exc:
            self.report.config_error = f"piper driver not configured: {exc}"
            self.get_logger().error(self.report.config_error)

        cfg = self.config
        self.commander = CommanderGate(
            resolve_node_name(self.commander_config.node_name, self.get_namespace()),
            allow_claim=self.commander_config.allow_claim,
        )
        self._core = DriverCore(
            self._controller,
            self.report,
            self.get_logger(),
            can_channel=cfg.can_channel,
            interface=cfg.interface,
            reconnect_period_s=cfg.reconnect_period_s,
            reconnect_max_period_s=cfg.reconnect_max_period_s,
            enable_on_start=cfg.enable_on_start,
            stamp_clock=lambda: self.get_clock().now().nanoseconds * 1e-9,
            sdk_log=capture_sdk_log(),
        )
        # The controller and the robot's command side are touched from one group only; the
        # diagnostics run beside it, and the feedback (observe + publish) on a thread of its
        # own (below), so holding never delays /joint_states.
        self._control_group = MutuallyExclusiveCallbackGroup()
        self._diagnostics_group = MutuallyExclusiveCallbackGroup()
        self._joint_pub = self.create_publisher(JointState, "/joint_states", 10)
        self._pose_pub = self.create_publisher(PoseStamped, "/ee_pose", 10)
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        # /heisd/ee_command (from the commander only), ~/claim_control, ~/release_control.
        self._commands = CommandInput(
            self, self.commander, self._core, self.report, callback_group=self._control_group
        )
        for name, answer in (
            ("~/enable", self._core.enable_service),
            ("~/disable", self._core.disable_service),
            ("~/estop", self._core.estop_service),
            ("~/clear_fault", self._core.clear_fault_service),
        ):
            self.create_service(
                Trigger, name, _trigger_handler(answer), callback_group=self._control_group
            )
        self.create_timer(
            1.0 / cfg.control_rate_hz, self._core.tick, callback_group=self._control_group
        )
        self.create_timer(
            cfg.diagnostics_period_s,
            self._publish_diagnostics,
            callback_group=self._diagnostics_group,
        )
        if self.emulator is not None:
            create_emulator_services(self, self.emulator)
        # /joint_states + /ee_pose come from a thread of their own, not an executor timer: at
        # 200 Hz the executor's wake-up, wait-set rebuild and hand-off to a worker cost more
        # than the publishing itself.
        self._feedback_stop = threading.Event()
        self._feedback_thread = threading.Thread(
            target=self._feedback_loop,
            args=(1.0 / cfg.feedback_rate_hz,),
            name="piper_driver-feedback",
            daemon=True,
        )
        self._feedback_thread.start()

    def _configure(self, robot_factory: RobotFactory) -> None:
        """Read every parameter into its config; build the emulator, robot and controller."""
        self.config = cfg = dataclass_from_parameters(self, PiperDriverConfig)
        self.commander_config = dataclass_from_parameters(self, CommanderConfig, "commander")
        # The node's own parameters fill the fields the component configs share with it.
        self.piper_config = config_from_parameters(
            self,
            PiperConfig,
            "piper",
            can_channel=cfg.can_channel,
            interface=cfg.interface,
            enable_on_connect=False,  # the node enables after connecting (enable_on_start)
        )
        safety = config_from_parameters(
            self, SafetyConfig, "safety", defaults=DRIVER_SAFETY_DEFAULTS, frame_id=cfg.frame_id
        )
        gripper = dataclass_from_parameters(self, GripperConfig, "gripper")
        controller = controller_config_from_parameters(self)
        if cfg.emulate:
            emulator_config = config_from_parameters(
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

    def destroy_node(self) -> None:
        """Stop publishing; close the CAN connection (motors keep their state: no drop).

        The emulator, if any, stops too.
        """
        self._feedback_stop.set()
        self._feedback_thread.join(timeout=2.0)
        self._core.disconnect()
        if self.emulator is not None:
            self.emulator.stop()
        super().destroy_node()

    def _feedback_loop(self, period_s: float) -> None:
        """Call :meth:`_on_feedback` every ``period_s`` until :meth:`destroy_node`.

        A tick that comes late is not made up with a burst: the schedule restarts from now.
        An unexpected error is logged (with the count in ``feedback_errors``) and the loop goes
        on; errors after the node's context has shut down end it quietly.
        """
        next_s = time.monotonic()
        while not self._feedback_stop.wait(max(0.0, next_s - time.monotonic())):
            now_s = time.monotonic()
            next_s = next_s + period_s if next_s + period_s > now_s else now_s + period_s
            try:
                self._on_feedback()
            except Exception as exc:  # noqa: BLE001 - reported, and the feedback goes on
                if self._feedback_stop.is_set() or not self.context.ok():
                    return
                self.report.counts["feedback_errors"] += 1
                self.get_logger().error(
                    f"publishing feedback failed: {type(exc).__name__}: {exc}",
                    throttle_duration_sec=10.0,
                )

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
        self.report.counts["feedback_published"] += 1

    def _publish_diagnostics(self) -> None:
        self._core.refresh_sdk_log_count()  # current, not as of the last control tick
        msg = DiagnosticArray(status=[self.arm_diagnostic(), self.controller_diagnostic()])
        if self.emulator is not None:
            msg.status.append(self.emulator_diagnostic())
        msg.header.stamp = self.get_clock().now().to_msg()
        self._diag_pub.publish(msg)

    def arm_diagnostic(self) -> DiagnosticStatus:
        """CAN link, arm status code, motors, faults and the measured pose."""
        return diag.arm_diagnostic(
            self.get_name(), self.config, self.report, self._controller, self._last_state
        )

    def controller_diagnostic(self) -> DiagnosticStatus:
        """Controller status, gripper, the last command's fate, clamps and SDK errors."""
        return diag.controller_diagnostic(
            self.get_name(),
            self.config,
            self.report,
            self._controller,
            self._core.last_result,
            time.monotonic(),
            self.commander,
        )

    def emulator_diagnostic(self) -> DiagnosticStatus:
        """The emulated arm's ground truth (what it *is*, not what it reports over CAN)."""
        return diag.emulator_diagnostic(self.get_name(), self.config, self.emulator)


def _trigger_handler(answer: Callable[[], tuple[bool, str]]):
    """A std_srvs/Trigger callback that fills the response from ``answer()``."""

    def handler(_request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        response.success, response.message = answer()
        return response

    return handler


def main(args: list[str] | None = None) -> None:
    """Run the node until Ctrl-C (SIGINT), SIGTERM or ROS shutdown."""
    # Two threads: control (commands, tick, services) beside diagnostics; the feedback has a
    # thread of its own.
    spin_node(PiperDriverNode, args, num_threads=2)


if __name__ == "__main__":
    main()
