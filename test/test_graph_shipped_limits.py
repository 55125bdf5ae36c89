"""The deployed graph acts under a robot's message rates with the shipped freshness limits.

The PIPER driver on the emulated arm publishes /joint_states and /ee_pose at its 200 Hz
feedback rate, this process plays both cameras at 30 Hz, and the policy node runs the shipped
small VLA with the shipped YAML: nothing relaxed (``max_command_age_s``, ``input.*``). The
policy must send commands that the driver executes. Before the decoder had a process of its
own, the executor's work on the state stream starved it of the GIL and every command was held
as stale, and this test failed. It waits on conditions (commands counted) with a generous
overall timeout; how fast the graph runs is measured by ``heisd-bench graph``, not here.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from test.node_process import NodeProcess, write_params

rclpy = pytest.importorskip("rclpy")

ASSETS = Path(__file__).resolve().parents[1] / "heisd_ros" / "assets"
CAMERA_HZ = 30.0
COMMANDS_WANTED = 10
#: The whole graph (model load included) on a loaded 2-core machine; never a pass condition.
OVERALL_TIMEOUT_S = 300.0


def test_graph_under_200hz_state_sends_commands_with_shipped_limits(tmp_path, ros_domain):
    from diagnostic_msgs.msg import DiagnosticArray
    from heisd_ros.msg import EECommand
    from rclpy.executors import SingleThreadedExecutor
    from sensor_msgs.msg import Image, JointState

    from heisd_ros.nodes.image_conversion import rgb_to_image
    from heisd_ros.nodes.robot_msgs import stamp_to_seconds

    driver_params = write_params(tmp_path / "driver.yaml", "piper_driver_node", {
        "emulate": True, "interface": "virtual", "enable_on_start": True})
    policy_params = write_params(tmp_path / "policy.yaml", "policy_node", {
        "method": "drafter", "instruction": "put the red block on the plate",
        "model.path": str(ASSETS / "small_vla.safetensors"), "model.db_dir": ""})
    for name in ("driver", "policy"):
        (tmp_path / name).mkdir()
    driver = NodeProcess(["-m", "heisd_ros.nodes.piper_driver_node", "--ros-args",
                          "--params-file", str(driver_params)], tmp_path / "driver", ros_domain)
    policy = NodeProcess(["-m", "heisd_ros.nodes.policy_node", "--ros-args",
                          "--params-file", str(policy_params)], tmp_path / "policy", ros_domain)
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=ros_domain)
    node = rclpy.create_node("shipped_limits_test", context=context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    ages_s: list[float] = []
    states = {"n": 0}
    diagnostics: dict[str, dict[str, str]] = {}

    def on_command(msg) -> None:
        ages_s.append(node.get_clock().now().nanoseconds * 1e-9
                      - stamp_to_seconds(msg.header.stamp))

    def on_diagnostics(msg) -> None:
        for status in msg.status:
            diagnostics[status.name] = {kv.key: kv.value for kv in status.values}

    node.create_subscription(EECommand, "/heisd/ee_command", on_command, 100)
    node.create_subscription(DiagnosticArray, "/diagnostics", on_diagnostics, 50)
    node.create_subscription(JointState, "/joint_states",
                             lambda _m: states.__setitem__("n", states["n"] + 1), 50)
    cameras = [node.create_publisher(Image, topic, 2) for topic in
               ("/camera/third_person/image_raw", "/camera/wrist/image_raw")]
    rng = np.random.default_rng(0)
    frames = [rgb_to_image(rng.integers(0, 255, (224, 224, 3), np.uint8)) for _ in range(2)]

    def publish_frames() -> None:
        stamp = node.get_clock().now().to_msg()
        for publisher, frame in zip(cameras, frames, strict=True):
            frame.header.stamp, frame.header.frame_id = stamp, "base_link"
            publisher.publish(frame)

    node.create_timer(1.0 / CAMERA_HZ, publish_frames)
    def executed() -> int:
        return int(diagnostics.get("piper_driver_node: controller", {})
                   .get("commands_executed", 0))

    deadline = time.monotonic() + OVERALL_TIMEOUT_S
    try:
        while ((len(ages_s) < COMMANDS_WANTED or executed() < 1)
               and time.monotonic() < deadline):
            executor.spin_once(timeout_sec=0.1)
            assert driver.proc.poll() is None, driver.text()[-3000:]
            assert policy.proc.poll() is None, policy.text()[-3000:]
        policy_status = diagnostics.get("policy_node: policy", {})
        assert len(ages_s) >= COMMANDS_WANTED, (
            f"{len(ages_s)} commands in {OVERALL_TIMEOUT_S:.0f} s; the policy's holds: "
            f"{ {k: v for k, v in policy_status.items() if k.startswith('refused[')} }\n"
            + policy.text()[-3000:])
        assert executed() >= 1, diagnostics.get("piper_driver_node: controller")
        assert states["n"] > 0  # the driver's state stream reached the graph
    finally:
        executor.shutdown()
        node.destroy_node()
        context.try_shutdown()
        assert policy.stop() == 0, policy.text()[-3000:]
        assert driver.stop() == 0, driver.text()[-3000:]
