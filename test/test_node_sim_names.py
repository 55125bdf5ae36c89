"""The sim node over real DDS with bad suite/task names: it stays up, says why, and recovers.

One node starts with an unknown suite and task. It must log an error naming the value and
listing the valid names, publish nothing, ignore commands and refuse ``~/reset`` with the
message; once the parameters are corrected over the parameter service (what ``ros2 param
set`` does) a ``~/reset`` starts the episode. While it runs, unknown names are refused by the
parameter service, and a reset with a task of another suite is refused while the episode
goes on.
"""

from __future__ import annotations

import pytest

from test.polling import spin_for, spin_until
from test.ros_env import require_ros

rclpy, hmsg, _ = require_ros()

from geometry_msgs.msg import PoseStamped  # noqa: E402
from rcl_interfaces.msg import Log  # noqa: E402
from rcl_interfaces.srv import SetParameters  # noqa: E402
from rclpy.executors import MultiThreadedExecutor  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from rclpy.qos import qos_profile_rosout_default  # noqa: E402
from sensor_msgs.msg import Image, JointState  # noqa: E402
from std_srvs.srv import Trigger  # noqa: E402

from heisd_ros.nodes.qos import STATUS_QOS  # noqa: E402
from heisd_ros.nodes.sim_node import (  # noqa: E402
    THIRD_PERSON_TOPIC,
    WRIST_TOPIC,
    SimNode,
)
from heisd_ros.sim.suites import list_suites, list_tasks  # noqa: E402

EECommand, EpisodeStatus = hmsg.EECommand, hmsg.EpisodeStatus
OUTPUTS = ("joints", "pose", "third", "wrist", "status")


@pytest.fixture(scope="module")
def graph(module_ros_domain):
    """A sim node started with bad names, and a peer that records everything it sends."""
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=module_ros_domain)
    peer = rclpy.create_node("sim_names_peer", context=context)
    seen = {key: [] for key in (*OUTPUTS, "log")}
    for key, msg_type, topic, qos in (
            ("joints", JointState, "/joint_states", 10), ("pose", PoseStamped, "/ee_pose", 10),
            ("third", Image, THIRD_PERSON_TOPIC, 10), ("wrist", Image, WRIST_TOPIC, 10),
            ("status", EpisodeStatus, "/heisd/episode_status", STATUS_QOS),
            ("log", Log, "/rosout", qos_profile_rosout_default)):
        peer.create_subscription(msg_type, topic, seen[key].append, qos)
    sim = SimNode(context=context, parameter_overrides=[
        Parameter("suite", value="piper_nope"), Parameter("task", value="bogus"),
        Parameter("sim.image_width_px", value=48), Parameter("sim.image_height_px", value=48),
        Parameter("mode", value="lockstep"),
        Parameter("frame_republish_s", value=0.3), Parameter("state_period_s", value=0.05),
        Parameter("max_steps", value=50), Parameter("seed", value=5)])
    clients = {"reset": peer.create_client(Trigger, "/sim_node/reset"),
               "params": peer.create_client(SetParameters, "/sim_node/set_parameters"),
               "cmd": peer.create_publisher(EECommand, "/heisd/ee_command", 10)}
    executor = MultiThreadedExecutor(num_threads=3, context=context)
    executor.add_node(sim)
    executor.add_node(peer)
    yield sim, clients, executor, seen
    executor.shutdown()
    sim.destroy_node()
    peer.destroy_node()
    rclpy.shutdown(context=context)


def call(executor, client, request):
    assert client.wait_for_service(timeout_sec=10)
    future = client.call_async(request)
    assert spin_until(executor, future.done, 60)
    return future.result()


def reset(graph) -> Trigger.Response:
    _sim, clients, executor, _seen = graph
    return call(executor, clients["reset"], Trigger.Request())


def set_param(graph, name, value):
    """``ros2 param set /sim_node <name> <value>``: the SetParameters result."""
    _sim, clients, executor, _seen = graph
    request = SetParameters.Request(parameters=[Parameter(name, value=value).to_parameter_msg()])
    return call(executor, clients["params"], request).results[0]


def step(graph):
    """Send one command; spins until the sim ran it or ignored it."""
    sim, clients, executor, _seen = graph
    ran, ignored = sim.steps_run, sim.commands_ignored
    assert spin_until(executor, lambda: clients["cmd"].get_subscription_count() > 0)
    msg = EECommand(step_index=ran + ignored + 1000, gripper_from_target=True)
    msg.header.frame_id = "base_link"
    clients["cmd"].publish(msg)
    assert spin_until(executor, lambda: (sim.steps_run, sim.commands_ignored) != (ran, ignored))


def errors(seen, *needles) -> list[str]:
    """ERROR lines of the sim node on /rosout that contain every needle."""
    return [m.msg for m in seen["log"] if m.name == "sim_node" and m.level == Log.ERROR
            and all(n in m.msg for n in needles)]


def test_bad_names_at_start_leave_the_node_up_silent_and_saying_why(graph):
    sim, _clients, executor, seen = graph
    assert sim.config_error.startswith("sim not started: suite: unknown suite 'piper_nope'")
    assert all(repr(s) in sim.config_error for s in list_suites())
    assert spin_until(executor, lambda: errors(seen, "'piper_nope'", *list_suites())), [
        m.msg for m in seen["log"]]
    step(graph)
    assert (sim.steps_run, sim.commands_ignored) == (0, 1)
    assert sim._state is None and sim._frames is None  # nothing its timer could publish
    spin_for(executor, 1.0)  # state period 0.05 s, republish 0.3 s: nothing comes
    assert {key: len(seen[key]) for key in OUTPUTS} == dict.fromkeys(OUTPUTS, 0)
    answer = reset(graph)
    assert not answer.success and answer.message == sim.config_error
    assert "'piper_nope'" in answer.message and "piper_goal" in answer.message


def test_corrected_parameters_and_a_reset_start_the_episode(graph):
    sim, _clients, executor, seen = graph
    assert set_param(graph, "suite", "piper_goal").successful
    answer = reset(graph)  # the task is still bogus: now that is the message
    assert not answer.success
    assert "task: unknown task 'bogus' in suite 'piper_goal'" in answer.message
    assert all(repr(t) in answer.message for t in list_tasks("piper_goal"))
    assert not any(seen[key] for key in OUTPUTS)

    assert set_param(graph, "task", "red_block_on_plate").successful
    answer = reset(graph)
    assert answer.success, answer.message
    assert answer.message == "episode 0: piper_goal/red_block_on_plate seed 5"
    assert sim.config_error == ""
    assert spin_until(executor, lambda: all(seen[key] for key in OUTPUTS))
    assert (seen["status"][-1].task, seen["status"][-1].step) == ("red_block_on_plate", 0)
    step(graph)
    assert sim.steps_run == 1 and sim.episode_status.step == 1


def test_bad_names_at_run_time_are_refused_and_the_episode_goes_on(graph):
    sim, _clients, executor, seen = graph
    episode, steps = sim.episode_status.episode, sim.episode_status.step

    result = set_param(graph, "task", "nope")  # a name no suite has: the service refuses
    assert not result.successful
    assert "'nope'" in result.reason and all(t in result.reason for t in list_tasks("piper_goal"))
    assert spin_until(executor, lambda: errors(seen, "parameter not set", "'nope'"))
    result = set_param(graph, "suite", "piper_nope")
    assert not result.successful and all(s in result.reason for s in list_suites())
    assert sim.get_parameter("task").value == "red_block_on_plate"
    assert sim.get_parameter("suite").value == "piper_goal"

    # a task of another suite is taken (switching both takes two sets); the reset refuses it
    assert set_param(graph, "task", "green_can_in_basket").successful
    answer = reset(graph)
    assert not answer.success
    assert answer.message.startswith("reset refused: task: unknown task 'green_can_in_basket' "
                                     "in suite 'piper_goal'")
    assert f"episode {episode} of red_block_on_plate goes on" in answer.message
    status = sim.episode_status
    assert (status.episode, status.task, status.step, status.done) == (
        episode, "red_block_on_plate", steps, False)
    step(graph)
    assert sim.episode_status.step == steps + 1 and sim.commands_ignored == 1

    assert set_param(graph, "suite", "piper_object").successful
    answer = reset(graph)
    assert answer.success, answer.message
    assert sim.config_error == ""
    status = sim.episode_status
    assert (status.suite, status.task, status.episode, status.step) == (
        "piper_object", "green_can_in_basket", episode + 1, 0)
    assert spin_until(executor, lambda: seen["status"][-1].task == "green_can_in_basket")
