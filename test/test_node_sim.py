"""The sim node in this process over real DDS: steps per command, strict gripper, episodes."""

from __future__ import annotations

import numpy as np
import pytest

from test.polling import spin_until
from test.ros_env import require_ros

rclpy, hmsg, _ = require_ros()

from rclpy.executors import MultiThreadedExecutor  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from sensor_msgs.msg import Image, JointState  # noqa: E402
from std_srvs.srv import Trigger  # noqa: E402

from heisd_ros.nodes.qos import STATUS_QOS  # noqa: E402
from heisd_ros.nodes.sim_node import SimNode  # noqa: E402

EECommand, EpisodeStatus = hmsg.EECommand, hmsg.EpisodeStatus


@pytest.fixture(scope="module")
def graph(module_ros_domain):
    """Sim node + a test node on a private context and DDS domain."""
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=module_ros_domain)
    sim = SimNode(context=context, parameter_overrides=[
        Parameter("sim.image_width_px", value=48), Parameter("sim.image_height_px", value=48),
        Parameter("mode", value="lockstep"),
        Parameter("frame_republish_s", value=0.3), Parameter("max_steps", value=12),
        Parameter("seed", value=3), Parameter("auto_reset", value=False)])
    peer = rclpy.create_node("sim_test_peer", context=context)
    seen = {"images": [], "joints": [], "status": []}
    peer.create_subscription(Image, "/camera/wrist/image_raw", seen["images"].append, 10)
    peer.create_subscription(JointState, "/joint_states", seen["joints"].append, 10)
    peer.create_subscription(EpisodeStatus, "/heisd/episode_status", seen["status"].append,
                             STATUS_QOS)
    pub = peer.create_publisher(EECommand, "/heisd/ee_command", 10)
    reset = peer.create_client(Trigger, "/sim_node/reset")
    executor = MultiThreadedExecutor(num_threads=3, context=context)
    executor.add_node(sim)
    executor.add_node(peer)
    yield sim, peer, pub, reset, executor, seen
    executor.shutdown()
    sim.destroy_node()
    peer.destroy_node()
    rclpy.shutdown(context=context)


def command(index, dx=0.0, gripper=0, from_target=True, frame="base_link"):
    msg = EECommand(step_index=index, gripper=gripper, gripper_from_target=from_target)
    msg.translation_m.x = dx
    msg.header.frame_id = frame
    return msg


def test_frames_state_and_status_at_start(graph):
    sim, _peer, pub, _reset, executor, seen = graph
    assert spin_until(executor, lambda: seen["images"] and seen["joints"] and seen["status"])
    image = seen["images"][-1]
    assert (image.encoding, image.width, image.height) == ("rgb8", 48, 48)
    assert image.header.frame_id == "base_link" and image.header.stamp.sec > 0
    status = seen["status"][-1]
    assert (status.suite, status.task, status.seed, status.step) == (
        "piper_goal", "red_block_on_plate", 3, 0)
    assert status.instruction == "put the red block on the plate"
    assert spin_until(executor, lambda: pub.get_subscription_count() > 0)


def test_each_command_is_one_step_through_the_safety_filter(graph):
    sim, _peer, pub, _reset, executor, seen = graph
    x0 = sim._state.ee_position_m[0]
    steps0 = sim.steps_run
    for i in range(3):
        pub.publish(command(i, dx=0.01))
        assert spin_until(executor, lambda i=i: sim.steps_run == steps0 + i + 1)
    assert sim.episode_status.step == 3
    assert sim._state.ee_position_m[0] - x0 == pytest.approx(0.03, abs=0.008)
    # NaN: refused by the safety filter with a reason; the arm holds for one period
    pub.publish(command(3, dx=float("nan")))
    assert spin_until(executor, lambda: sim.steps_run == steps0 + 4)
    assert sim._state.ee_position_m[0] - x0 == pytest.approx(0.03, abs=0.008)


def test_gripper_changes_only_on_target_commands(graph):
    sim, _peer, pub, _reset, executor, seen = graph
    start = sim.steps_run
    for i in range(3):  # a relaxed/skipped draft's gripper is never executed
        pub.publish(command(10 + i, gripper=1, from_target=False))
        assert spin_until(executor, lambda i=i: sim.steps_run == start + i + 1)
    assert sim._state.gripper_width_m > 0.06
    assert sim._controller.gripper.state.name == "OPEN"
    for i in range(2):  # hysteresis: two target-produced commands in a row
        pub.publish(command(13 + i, gripper=1, from_target=True))  # contiguous: no gap
        assert spin_until(executor, lambda i=i: sim.steps_run == start + 4 + i)
    assert sim._controller.gripper.state.name == "CLOSED"


def test_reset_takes_the_seed_and_max_steps_ends_the_episode(graph):
    """Without auto_reset an ended episode waits for ~/reset (test_node_sim_auto_reset: with)."""
    sim, peer, pub, reset, executor, seen = graph
    sim.set_parameters([Parameter("seed", value=42)])
    assert reset.wait_for_service(timeout_sec=10)
    future = reset.call_async(Trigger.Request())
    assert spin_until(executor, future.done)
    assert future.result().success, future.result().message
    assert "seed 42" in future.result().message
    status = sim.episode_status
    assert (status.seed, status.step, status.done) == (42, 0, False)
    episode = status.episode
    for i in range(12):
        pub.publish(command(100 + i, dx=0.002))
        assert spin_until(executor, lambda i=i: sim.episode_status.step == i + 1)
    assert sim.episode_status.done and sim.episode_status.reason == "max_steps"
    ignored = sim.commands_ignored
    pub.publish(command(200))
    assert spin_until(executor, lambda: sim.commands_ignored == ignored + 1)
    assert sim.episode_status.step == 12
    future = reset.call_async(Trigger.Request())
    assert spin_until(executor, future.done)
    assert sim.episode_status.seed == 43 and sim.episode_status.episode == episode + 1
    assert np.isfinite(sim._state.ee_position_m).all()
