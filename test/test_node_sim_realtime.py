"""The sim node in real time over real DDS: the world does not wait for commands.

Frames and states stream with no command; the arm tracks the latest accepted command between
frames (a newer command replaces an older one mid-motion); a command on frames older than
``max_command_age_s`` is refused and counted, as on the driver; an episode ends by itself at
its time limit and the next one starts.
"""

from __future__ import annotations

import numpy as np
import pytest

from test.polling import spin_until
from test.ros_env import require_ros

rclpy, hmsg, _ = require_ros()

from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from geometry_msgs.msg import PoseStamped  # noqa: E402
from rclpy.clock import Clock  # noqa: E402
from rclpy.executors import MultiThreadedExecutor  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402

from heisd_ros.nodes.qos import STATUS_QOS  # noqa: E402
from heisd_ros.nodes.sim_node import SIM_DIAGNOSTICS, SimNode  # noqa: E402
from heisd_ros.nodes.sim_params import SimNodeConfig  # noqa: E402

EECommand, EpisodeStatus = hmsg.EECommand, hmsg.EpisodeStatus
#: World seconds per episode: the tests below fit in it, the time-limit test waits for it.
MAX_STEPS = 120
#: The sim's max_command_age_s here, s.
AGE_LIMIT_S = 30.0


def stamp_s(msg) -> float:
    return msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9


@pytest.fixture(scope="module")
def graph(module_ros_domain):
    """A real-time sim node + a test node on a private context and DDS domain."""
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=module_ros_domain)
    sim = SimNode(context=context, parameter_overrides=[
        Parameter("mode", value="realtime"),
        Parameter("sim.image_width_px", value=48), Parameter("sim.image_height_px", value=48),
        Parameter("third_person_rate_hz", value=20.0), Parameter("wrist_rate_hz", value=10.0),
        Parameter("state_period_s", value=0.01), Parameter("max_steps", value=MAX_STEPS),
        Parameter("seed", value=3), Parameter("auto_reset_delay_s", value=0.2),
        # a loaded test machine must not end the episode for a slow command (the arm holds),
        # nor refuse a fresh command the busy sim takes late (the age check is tested with a
        # stamp far beyond this limit)
        Parameter("safety.watchdog_timeout_s", value=60.0),
        Parameter("max_command_age_s", value=AGE_LIMIT_S)])
    peer = rclpy.create_node("sim_realtime_peer", context=context)
    seen = {"third": [], "wrist": [], "pose": [], "status": [], "diagnostics": []}
    peer.create_subscription(Image, "/camera/third_person/image_raw", seen["third"].append, 50)
    peer.create_subscription(Image, "/camera/wrist/image_raw", seen["wrist"].append, 50)
    peer.create_subscription(PoseStamped, "/ee_pose", seen["pose"].append, 500)
    peer.create_subscription(EpisodeStatus, "/heisd/episode_status", seen["status"].append,
                             STATUS_QOS)
    peer.create_subscription(DiagnosticArray, "/diagnostics", lambda m: seen["diagnostics"].extend(
        {kv.key: kv.value for kv in st.values} for st in m.status if st.name == SIM_DIAGNOSTICS),
        10)
    pub = peer.create_publisher(EECommand, "/heisd/ee_command", 10)
    executor = MultiThreadedExecutor(num_threads=3, context=context)
    executor.add_node(sim)
    executor.add_node(peer)
    yield sim, pub, executor, seen
    executor.shutdown()
    sim.destroy_node()
    peer.destroy_node()
    rclpy.shutdown(context=context)


def command(index, dx=0.0, age_s=0.0):
    """A command stamped ``age_s`` before now (the frames it was decided on)."""
    msg = EECommand(step_index=index, gripper=0, gripper_from_target=True)
    msg.translation_m.x = dx
    msg.header.frame_id = "base_link"
    msg.header.stamp = Clock().now().to_msg()
    msg.header.stamp.sec -= int(age_s)
    return msg


def pose_x(msg) -> float:
    return msg.pose.position.x


def test_frames_and_states_stream_while_no_command_comes(graph):
    sim, _pub, executor, seen = graph
    assert spin_until(executor, lambda: seen["status"]), "no episode status"
    episode = seen["status"][-1].episode
    third0, wrist0, pose0 = len(seen["third"]), len(seen["wrist"]), len(seen["pose"])
    assert spin_until(executor, lambda: len(seen["third"]) >= third0 + 8
                      and len(seen["wrist"]) >= wrist0 + 4 and len(seen["pose"]) >= pose0 + 20), (
        f"frames stopped without commands: {len(seen['third']) - third0} third-person, "
        f"{len(seen['wrist']) - wrist0} wrist, {len(seen['pose']) - pose0} poses")
    assert seen["status"][-1].episode == episode and not seen["status"][-1].done
    stamps = [stamp_s(m) for m in seen["third"][third0:]]
    assert all(b > a for a, b in zip(stamps, stamps[1:], strict=False)), "stamps must advance"
    assert sim.steps_run == 0 and sim.frames_published[0] > sim.frames_published[1] > 0


def test_the_arm_tracks_the_latest_command_between_frames(graph):
    sim, pub, executor, seen = graph
    assert spin_until(executor, lambda: seen["pose"])
    x0 = pose_x(seen["pose"][-1])
    poses0, frames0 = len(seen["pose"]), len(seen["third"])
    pub.publish(command(0, dx=0.02))  # the default safety filter's step limit
    # One command, then nothing: the arm moves there over several states and frames.
    assert spin_until(executor, lambda: pose_x(seen["pose"][-1]) > x0 + 0.017), (
        f"the arm did not follow the command: x {x0:.4f} -> {pose_x(seen['pose'][-1]):.4f} m")
    moving = [pose_x(m) for m in seen["pose"][poses0:]]
    assert len({round(x, 5) for x in moving}) >= 3, "the motion should show in several states"
    assert spin_until(executor, lambda: len(seen["third"]) >= frames0 + 3)
    images = [np.frombuffer(bytes(m.data), np.uint8) for m in seen["third"][frames0:]]
    assert any(not np.array_equal(a, b) for a, b in zip(images, images[1:], strict=False)), (
        "the frames should show the arm moving")
    # A newer command replaces the older one: the arm ends at the latest target.
    pub.publish(command(1, dx=0.02))
    pub.publish(command(2, dx=-0.01))
    assert spin_until(executor, lambda: sim.steps_run == 3)
    assert spin_until(executor, lambda: abs(pose_x(seen["pose"][-1]) - (x0 + 0.03)) < 0.003), (
        f"expected x {x0 + 0.03:.4f} m (the latest target, not the one before at "
        f"{x0 + 0.04:.4f}), at {pose_x(seen['pose'][-1]):.4f}")
    assert seen["status"][-1].step == 3


def test_a_command_on_old_frames_is_refused_and_counted(graph):
    sim, pub, executor, seen = graph
    refused, ran = sim.commands_refused_age, sim.steps_run
    pub.publish(command(3, dx=0.01, age_s=4 * AGE_LIMIT_S))
    assert spin_until(executor, lambda: sim.commands_refused_age == refused + 1), (
        f"a command on {4 * AGE_LIMIT_S:g} s old frames was not refused for its age")
    assert sim.steps_run == ran, "the arm took a command older than max_command_age_s"
    assert spin_until(executor, lambda: seen["diagnostics"] and int(
        seen["diagnostics"][-1]["commands_refused_age"]) == refused + 1), "no diagnostics"
    counters = seen["diagnostics"][-1]
    assert counters["commands_executed_past_age"] == "0"
    assert counters["max_command_age_s"] == str(AGE_LIMIT_S)
    assert 0.0 < float(counters["max_executed_age_ms"]) < AGE_LIMIT_S * 1e3


def test_an_episode_ends_at_its_time_limit_and_the_next_starts(graph):
    sim, _pub, executor, seen = graph
    # The limit is world time; a loaded machine slows the world (the node's max_lag), so the
    # wait is bounded by the world's progress: it fails when the world stops, not when it is slow.
    world_s = sim._env.data.time
    for _window in range(30):
        if spin_until(executor, lambda: seen["status"] and seen["status"][-1].done,
                      timeout_s=20.0):
            break
        assert sim._env.data.time > world_s + 0.1, (
            f"the world stopped at {sim._env.data.time:.2f} s before the episode's time limit")
        world_s = sim._env.data.time
    assert seen["status"][-1].done, f"the episode never ended (world at {world_s:.2f} s)"
    end = seen["status"][-1]
    assert (end.reason, end.success, end.step) == ("time_limit", False, 3)
    assert spin_until(executor, lambda: seen["status"][-1].episode == end.episode + 1
                      and not seen["status"][-1].done), "no next episode"
    assert seen["status"][-1].step == 0 and seen["status"][-1].seed == end.seed + 1


def test_mode_and_rates_are_checked():
    with pytest.raises(ValueError, match="mode: expected one of realtime, lockstep"):
        SimNodeConfig(mode="fast")
    with pytest.raises(ValueError, match="time_scale"):
        SimNodeConfig(time_scale=0.0)
    with pytest.raises(ValueError, match="wrist_rate_hz"):
        SimNodeConfig(wrist_rate_hz=float("nan"))
    assert SimNodeConfig().mode == "realtime"
