"""The PIPER driver node's /diagnostics entries, built from what the node knows.

Three entries, each named ``<node>: <what>`` with hardware id ``piper:<interface>:<channel>``:

- ``arm``: CAN link (connection attempts, port reopens, piper_sdk's captured log lines), arm
  status code, motors, faults and the measured pose;
- ``controller``: controller status, gripper, the last command's fate, clamps, SDK errors and
  the commander (who may move the arm, commands refused per sending node);
- ``emulated arm`` (only with ``emulate``): the emulator's ground truth.

Functions of their inputs (no node, no clock: the caller passes ``now_s``), so the rules for
levels and messages live in one place.
"""

from __future__ import annotations

from diagnostic_msgs.msg import DiagnosticStatus

from heisd_ros.nodes.driver_commander import CommanderGate
from heisd_ros.nodes.driver_config import PiperDriverConfig
from heisd_ros.nodes.driver_report import LATCHED, DriverReport
from heisd_ros.nodes.robot_msgs import (
    arm_state_diagnostic,
    controller_diagnostic_level,
    json_values,
    key_values,
)
from heisd_ros.robot.base import RobotState
from heisd_ros.robot.controller import RobotController, StepResult
from heisd_ros.robot.emulated_piper import EmulatedPiper


def driver_status(
    node_name: str, config: PiperDriverConfig, what: str, level: bytes, message: str,
    values: dict,
) -> DiagnosticStatus:
    """One diagnostic entry ``<node_name>: <what>`` of the arm on ``config``'s CAN channel."""
    return DiagnosticStatus(
        level=level,
        name=f"{node_name}: {what}",
        message=message,
        hardware_id=f"piper:{config.interface}:{config.can_channel}",
        values=key_values(values),
    )


def arm_diagnostic(
    node_name: str,
    config: PiperDriverConfig,
    report: DriverReport,
    controller: RobotController | None,
    state: RobotState | None,
) -> DiagnosticStatus:
    """CAN link, arm status code, motors, faults and the measured pose.

    Args:
        node_name: name of the reporting node.
        config: the node's settings (channel, interface, emulate).
        report: the node's errors and counters.
        controller: None when the node is not configured.
        state: the newest observed robot state, None before the first one.
    """
    connected = controller is not None and controller.robot.is_connected
    values = {
        "can_channel": config.can_channel,
        "interface": config.interface,
        "emulated": config.emulate,
        "connected": connected,
        "enable_error": report.enable_error,
        **report.link_values(),
    }
    if report.config_error:
        return driver_status(
            node_name, config, "arm", DiagnosticStatus.ERROR, report.config_error, values
        )
    if not connected or state is None:
        message = report.connect_error or "CAN: connecting to the PIPER"
        return driver_status(node_name, config, "arm", DiagnosticStatus.ERROR, message, values)
    level, message, arm_values = arm_state_diagnostic(state)
    values.update(arm_values, feedback_published=report.counts["feedback_published"])
    if report.link_error:
        message = f"{message}; {report.link_error}"
    return driver_status(node_name, config, "arm", level, message, values)


def controller_diagnostic(
    node_name: str,
    config: PiperDriverConfig,
    report: DriverReport,
    controller: RobotController | None,
    result: StepResult | None,
    now_s: float,
    commander: CommanderGate | None = None,
) -> DiagnosticStatus:
    """Controller status, gripper, the last command's fate, clamps, SDK errors, commander.

    Args:
        node_name: name of the reporting node.
        config: the node's settings.
        report: the node's errors and counters.
        controller: None when the node is not configured.
        result: the newest step/tick result, None before the first one.
        now_s: monotonic seconds, to age the last SDK error and the last foreign command.
        commander: who may command the arm; its refusals make an OK status WARN for a while.
    """
    ctl = controller
    outcome, reason = report.last_outcome
    sdk_recent = report.sdk_error_recent(now_s)
    values = {
        "status": ctl.status.value if ctl is not None else "unconfigured",
        "gripper": ctl.gripper.state.name.lower() if ctl is not None else "",
        "gripper_phase": ctl.gripper.phase.value if ctl is not None else "",
        "gripper_last_done": ctl.gripper.last_done_reason.value if ctl is not None else "",
        "detail": result.detail if result is not None else "",
        "faults": ",".join(sorted(f.value for f in result.faults)) if result else "",
        "last_command": outcome,
        "last_rejected_reason": reason,
        "last_clamped": report.last_clamped,
        "sdk_error": report.sdk_error if sdk_recent else "",
        **report.command_counts(),
        **(commander.values() if commander is not None else {}),
    }
    if ctl is not None:
        values["watchdog_timeout_s"] = ctl.safety.config.watchdog_timeout_s
    status = ctl.status if ctl is not None else None
    if not_ready := report.not_ready(ctl):
        connecting = not_ready == "connecting to the PIPER"
        level = DiagnosticStatus.WARN if connecting else DiagnosticStatus.ERROR
        return driver_status(node_name, config, "controller", level, not_ready, values)
    level, message = controller_diagnostic_level(status, values["detail"])
    if sdk_recent and status not in LATCHED:
        level, message = DiagnosticStatus.ERROR, f"SDK error: {report.sdk_error}; holding"
    elif level == DiagnosticStatus.OK and reason and outcome.endswith("rejected"):
        level, message = DiagnosticStatus.WARN, f"{outcome}: {reason}"
    elif level == DiagnosticStatus.OK and commander is not None and commander.warning(now_s):
        level, message = DiagnosticStatus.WARN, commander.warning(now_s)
    return driver_status(node_name, config, "controller", level, message, values)


def emulator_diagnostic(
    node_name: str, config: PiperDriverConfig, emulator: EmulatedPiper
) -> DiagnosticStatus:
    """The emulated arm's ground truth (what it *is*, not what it reports over CAN)."""
    truth = emulator.state()
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
    return driver_status(
        node_name, config, "emulated arm", DiagnosticStatus.OK, "emulator running", values
    )
