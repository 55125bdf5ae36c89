"""The PIPER driver node in this process (private context): parameters, config errors, messages.

The behaviour against the emulated arm runs with the node in its own process in
``test_node_driver.py``; here are the parts that need no second process.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from test.ros_env import require_ros

rclpy, hmsg, hsrv = require_ros()

from diagnostic_msgs.msg import DiagnosticStatus  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from sensor_msgs.msg import JointState  # noqa: E402
from std_srvs.srv import Trigger  # noqa: E402

from heisd_ros.geometry.rotations import rpy_to_matrix  # noqa: E402
from heisd_ros.nodes.driver_config import (  # noqa: E402
    DEFAULT_MAX_COMMAND_AGE_S,
    DEFAULT_MAX_COMMAND_FUTURE_S,
    DRIVER_SAFETY_DEFAULTS,
    PiperDriverConfig,
)
from heisd_ros.nodes.piper_driver_node import PiperDriverNode  # noqa: E402
from heisd_ros.nodes.robot_msgs import (  # noqa: E402
    ee_command_from_msg,
    ee_command_to_msg,
    ee_pose_msg,
    joint_state_msg,
    pose_from_msg,
    seconds_to_stamp,
)
from heisd_ros.robot.base import (  # noqa: E402
    CommandMode,
    CommandSource,
    EECommand,
    GripperState,
    RobotState,
)
from heisd_ros.robot.dry_run import unique_channel  # noqa: E402
from heisd_ros.robot.emulated_piper import EmulatedPiperConfig  # noqa: E402
from heisd_ros.robot.gripper import GripperConfig  # noqa: E402
from heisd_ros.robot.piper import PiperConfig  # noqa: E402
from heisd_ros.robot.safety import SafetyConfig  # noqa: E402
from test.polling import spin_until  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
YAML = REPO / "config" / "piper_driver_node.yaml"

# piper_sdk 0.6.2 still passes python-can's deprecated `bustype`.
pytestmark = pytest.mark.filterwarnings(
    "ignore:The 'bustype' argument is deprecated:DeprecationWarning"
)


def _flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        out.update(_flatten(value, name + ".") if isinstance(value, dict) else {name: value})
    return out


def _section(params: dict, prefix: str) -> dict:
    return {k[len(prefix) + 1 :]: v for k, v in params.items() if k.startswith(prefix + ".")}


@pytest.fixture(scope="module")
def ros(module_ros_domain):
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=module_ros_domain)
    client_node = rclpy.create_node("piper_driver_inprocess_client", context=context)
    yield context, client_node
    client_node.destroy_node()
    rclpy.shutdown(context=context)


@pytest.fixture
def start(ros):
    """Build a PiperDriverNode from parameters; yields it (destroyed afterwards)."""
    context, _ = ros
    started = []

    def _start(params: dict) -> PiperDriverNode:
        overrides = [Parameter(name, value=value) for name, value in params.items()]
        node = PiperDriverNode(context=context, parameter_overrides=overrides)
        started.append(node)
        return node

    yield _start
    for node in started:
        node.destroy_node()


def _tuples(values: dict) -> dict:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}


def test_shipped_yaml_sets_exactly_the_declared_parameters(start):
    params = _flatten(yaml.safe_load(YAML.read_text())["piper_driver_node"]["ros__parameters"])
    channel = unique_channel("driver-yaml")
    params.update(emulate=True, interface="virtual", can_channel=channel)
    node = start(params)
    assert not node.report.config_error, node.report.config_error
    builtin = {"use_sim_time", "start_type_description_service"}
    declared = {name for name in node._parameters if name not in builtin}
    assert declared == set(params), (
        f"in the YAML only: {set(params) - declared}; declared only: {declared - set(params)}"
    )
    assert all(node.describe_parameter(name).read_only for name in declared)
    top = {k: v for k, v in params.items() if "." not in k}
    assert node.config == PiperDriverConfig(**_tuples(top))
    assert node.piper_config == PiperConfig(
        can_channel=channel, interface="virtual", **_section(params, "piper")
    )
    controller = node._controller
    assert controller.safety.config == SafetyConfig(
        frame_id="base_link", **_tuples(_section(params, "safety"))
    )
    assert controller.gripper.config == GripperConfig(**_section(params, "gripper"))
    assert controller.config.max_tracking_error_m == params["controller.max_tracking_error_m"]
    assert controller.config.max_command_age_s == params["controller.max_command_age_s"]
    assert controller.config.max_command_future_s == params["controller.max_command_future_s"]
    assert (params["controller.max_command_age_s"], params["controller.max_command_future_s"]) == (
        DEFAULT_MAX_COMMAND_AGE_S, DEFAULT_MAX_COMMAND_FUTURE_S)
    assert node.emulator.config == EmulatedPiperConfig(
        channel=channel, interface="virtual", **_tuples(_section(params, "emulator"))
    )
    # The YAML repeats the node's defaults (so it documents them): the library's, except where
    # the driver deliberately differs (speed limits the library leaves off for the simulator;
    # the emulated arm starts in a ready pose with the gripper open).
    for section, cls, driver_defaults in (("piper", PiperConfig, {}),
                                          ("safety", SafetyConfig, DRIVER_SAFETY_DEFAULTS),
                                          ("gripper", GripperConfig, {})):
        defaults = {f.name: f.default for f in dataclasses.fields(cls)} | driver_defaults
        for key, value in _tuples(_section(params, section)).items():
            assert value == pytest.approx(defaults[key]), f"{section}.{key}"


@pytest.mark.parametrize(
    "params, words",
    [
        ({"emulate": True, "interface": "socketcan"}, ["interface", "'virtual'", "socketcan"]),
        ({"safety.max_step_translation_m": -0.01}, ["safety", "max_step_translation_m"]),
        ({"gripper.hysteresis_steps": 0}, ["gripper", "hysteresis_steps"]),
        ({"piper.move_mode": "j"}, ["piper", "move_mode", "'j'"]),
        ({"feedback_rate_hz": "fast"}, ["feedback_rate_hz", "fast"]),
        ({"controller.max_tracking_error_m": -1.0}, ["max_tracking_error_m"]),
        ({"controller.max_command_age_s": -0.5}, ["max_command_age_s"]),
        ({"reconnect_max_period_s": 1.0}, ["reconnect_max_period_s"]),
        ({"safety.max_linear_speed_m_s": -1.0}, ["safety", "max_linear_speed_m_s"]),
    ],
)
def test_invalid_parameters_become_errors_on_diagnostics_and_services(ros, start, params, words):
    _, client_node = ros
    node = start({"interface": "virtual", "can_channel": unique_channel("driver-bad"), **params})
    for status in (node.arm_diagnostic(), node.controller_diagnostic()):
        assert status.level == DiagnosticStatus.ERROR
        assert all(w in status.message for w in words), status.message
    executor = SingleThreadedExecutor(context=node.context)
    executor.add_node(node)
    executor.add_node(client_node)
    client = client_node.create_client(Trigger, "/piper_driver_node/enable")
    try:
        assert client.wait_for_service(timeout_sec=10)
        future = client.call_async(Trigger.Request())
        executor.spin_until_future_complete(future, timeout_sec=10)
        reply = future.result()
        assert not reply.success and all(w in reply.message for w in words), reply.message
    finally:
        client_node.destroy_client(client)
        executor.remove_node(client_node)
        executor.shutdown()


# --- message conversions (no node) ---------------------------------------------------------


def test_ee_command_round_trips_and_keeps_nan_for_the_safety_filter():
    command = EECommand(
        (0.01, -0.02, math.nan), (0.1, 0.0, -0.3), gripper=GripperState.CLOSED,
        gripper_from_target=True, mode=CommandMode.ABSOLUTE, source=CommandSource.RETRIEVAL,
        step_index=2**40, stamp_s=12.25, frame_id="base_link",
    )
    back = ee_command_from_msg(ee_command_to_msg(command))
    np.testing.assert_array_equal(back.translation_m, command.translation_m)  # NaN kept
    np.testing.assert_array_equal(back.rotation_rad, command.rotation_rad)
    for name in ("gripper", "gripper_from_target", "mode", "source", "step_index", "stamp_s",
                 "frame_id"):
        assert getattr(back, name) == getattr(command, name), name
    assert not back.is_finite
    # The message constants are the library's numbers.
    msg_type = hmsg.EECommand
    assert (msg_type.MODE_ABSOLUTE, msg_type.GRIPPER_CLOSED, msg_type.SOURCE_RETRIEVAL_SKIP) == (
        CommandMode.ABSOLUTE, GripperState.CLOSED, CommandSource.RETRIEVAL_SKIP)
    bad = ee_command_to_msg(command)
    bad.source = 9
    with pytest.raises(ValueError, match="source"):
        ee_command_from_msg(bad)


def test_robot_state_becomes_joint_state_and_pose_in_si_units():
    state = RobotState(
        stamp_s=1.0, joint_positions_rad=(0.1, 0.2, -0.3, 0.4, -0.5, 0.6), gripper_width_m=0.035,
        ee_position_m=(0.2, -0.1, 0.3), ee_rpy_rad=(3.0, 1.2, -2.0),
    )
    stamp = seconds_to_stamp(5.5)
    js = joint_state_msg(state, stamp)
    assert list(js.name)[-1] == "gripper" and len(js.name) == 7
    np.testing.assert_allclose(js.position, [0.1, 0.2, -0.3, 0.4, -0.5, 0.6, 0.035])
    assert (js.header.stamp.sec, js.header.stamp.nanosec) == (5, 500_000_000)
    pose = ee_pose_msg(state, stamp, "base_link")
    position, rpy = pose_from_msg(pose)
    assert pose.header.frame_id == "base_link"
    np.testing.assert_allclose(position, [0.2, -0.1, 0.3])
    np.testing.assert_allclose(rpy_to_matrix(rpy), rpy_to_matrix([3.0, 1.2, -2.0]), atol=1e-12)


def test_feedback_goes_on_without_the_executor_and_stops_with_the_node(ros):
    """/joint_states comes from the node's own thread, not from the executor.

    Once connected (the first control tick, run by the executor), the feedback needs no
    spinning; destroy_node ends it.
    """
    context, client = ros
    node = PiperDriverNode(context=context, parameter_overrides=[
        Parameter("emulate", value=True), Parameter("interface", value="virtual"),
        Parameter("can_channel", value=unique_channel("driver-feedback"))])
    received = []
    sub = client.create_subscription(JointState, "/joint_states", received.append, 100)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    executor.add_node(client)
    try:
        assert spin_until(executor, lambda: len(received) >= 5, timeout_s=30.0), \
            "no /joint_states from the emulated arm"
        executor.remove_node(node)  # from here on nothing runs the driver's callbacks
        spun_only_client = len(received)
        assert spin_until(executor, lambda: len(received) >= spun_only_client + 50,
                          timeout_s=30.0), "the feedback stopped when the executor did"
        stamps = [m.header.stamp.sec * 10**9 + m.header.stamp.nanosec for m in received]
        assert all(b > a for a, b in zip(stamps, stamps[1:], strict=False))
        node.destroy_node()
        assert not node._feedback_thread.is_alive()
    finally:
        executor.shutdown()
        client.destroy_subscription(sub)
