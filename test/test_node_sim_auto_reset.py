"""The sim node keeps running episodes: an ended episode is followed by the next by itself.

In this process over real DDS. ``auto_reset`` is left at its default (on): after
``auto_reset_delay_s`` the next episode starts with the next seed (or, with
``auto_reset_next_task``, the suite's next task), and /heisd/episode_status carries a new
(suite, task, episode, seed) key at step 0, which is what the policy node resets on.
"""

from __future__ import annotations

import time

import pytest

from test.polling import spin_until
from test.ros_env import require_ros

rclpy, hmsg, _ = require_ros()

from rclpy.executors import MultiThreadedExecutor  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402
from std_srvs.srv import Trigger  # noqa: E402

from heisd_ros.nodes.qos import STATUS_QOS  # noqa: E402
from heisd_ros.nodes.sim_node import WRIST_TOPIC, SimNode  # noqa: E402
from heisd_ros.nodes.sim_params import SimNodeConfig, next_task  # noqa: E402
from heisd_ros.sim.suites import list_tasks  # noqa: E402

EECommand, EpisodeStatus = hmsg.EECommand, hmsg.EpisodeStatus
SUITE, TASK = "piper_goal", "red_block_on_plate"
MAX_STEPS, DELAY_S = 3, 0.4


def stamp_s(msg) -> float:
    return msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9


class Graph:
    """A sim node with short episodes and a peer recording (receipt time, message)."""

    def __init__(self, domain: int, **overrides) -> None:
        self.context = rclpy.Context()
        rclpy.init(context=self.context, domain_id=domain)
        params = {"mode": "lockstep", "sim.image_width_px": 48, "sim.image_height_px": 48,
                  "seed": 5, "max_steps": MAX_STEPS, "auto_reset_delay_s": DELAY_S, **overrides}
        self.sim = SimNode(context=self.context, parameter_overrides=[
            Parameter(name, value=value) for name, value in params.items()])
        self.peer = rclpy.create_node("sim_auto_reset_peer", context=self.context)
        self.status: list[tuple[float, EpisodeStatus]] = []
        self.images: list[tuple[float, Image]] = []
        self.peer.create_subscription(
            EpisodeStatus, "/heisd/episode_status",
            lambda m: self.status.append((time.monotonic(), m)), STATUS_QOS)
        self.peer.create_subscription(Image, WRIST_TOPIC,
                                      lambda m: self.images.append((time.monotonic(), m)), 10)
        self.pub = self.peer.create_publisher(EECommand, "/heisd/ee_command", 10)
        self.reset = self.peer.create_client(Trigger, "/sim_node/reset")
        self.executor = MultiThreadedExecutor(num_threads=3, context=self.context)
        self.executor.add_node(self.sim)
        self.executor.add_node(self.peer)
        self.step_index = 0

    def keys(self) -> list[tuple]:
        """Distinct (suite, task, episode, seed) keys received, in order (the policy's key)."""
        keys: list[tuple] = []
        for _, m in self.status:
            key = (m.suite, m.task, m.episode, m.seed)
            if not keys or keys[-1] != key:
                keys.append(key)
        return keys

    def command(self) -> EpisodeStatus:
        """One command; the status the sim published after running it (one step further)."""
        assert spin_until(self.executor, lambda: self.pub.get_subscription_count() > 0)
        last = self.status[-1][1]
        self.pub.publish(EECommand(step_index=self.step_index, gripper_from_target=True))
        self.step_index += 1
        assert spin_until(self.executor, lambda: (self.status[-1][1].episode,
                                                  self.status[-1][1].step)
                          == (last.episode, last.step + 1))
        return self.status[-1][1]

    def finish_episode(self) -> EpisodeStatus:
        """Step the current episode to max_steps; the status that says it is over."""
        while not (status := self.command()).done:
            pass
        return status

    def close(self) -> None:
        self.executor.shutdown()
        self.sim.destroy_node()
        self.peer.destroy_node()
        rclpy.shutdown(context=self.context)


@pytest.fixture
def graph(request, ros_domain):
    g = Graph(ros_domain, **getattr(request, "param", {}))
    yield g
    g.close()


def test_an_ended_episode_is_followed_by_the_next_with_the_next_seed(graph):
    assert spin_until(graph.executor, lambda: graph.status)
    first = graph.status[-1][1]
    assert (first.task, first.seed, first.step, first.done) == (TASK, 5, 0, False)
    done = graph.finish_episode()
    assert (done.episode, done.reason, done.step) == (first.episode, "max_steps", MAX_STEPS)
    done_at = graph.status[-1][0]
    done_stamp = stamp_s(done)

    assert spin_until(graph.executor, lambda: len(graph.keys()) == 2), graph.keys()
    new_at, new = next((t, m) for t, m in graph.status if m.episode == first.episode + 1)
    # the next seed, the same task, step 0; the policy sees a new key
    assert (new.suite, new.task, new.seed, new.step, new.done) == (SUITE, TASK, 6, 0, False)
    assert graph.keys() == [(SUITE, TASK, first.episode, 5), (SUITE, TASK, first.episode + 1, 6)]
    # the pause: the end was published first and stood for auto_reset_delay_s (the sim's own
    # stamps: when this process receives them depends on the machine's load)
    assert stamp_s(new) - done_stamp >= DELAY_S - 0.01
    assert new_at >= done_at
    # fresh frames
    assert spin_until(graph.executor, lambda: any(t >= new_at for t, _ in graph.images))
    # the new episode runs: a command is step 1 of it
    assert spin_until(graph.executor, lambda: graph.status[-1][1].episode == first.episode + 1)
    status = graph.command()
    assert (status.episode, status.step, status.done) == (first.episode + 1, 1, False)

    # and again: it keeps going without anyone calling ~/reset
    graph.finish_episode()
    assert spin_until(graph.executor, lambda: len(graph.keys()) == 3), graph.keys()
    assert graph.keys()[-1] == (SUITE, TASK, first.episode + 2, 7)


@pytest.mark.parametrize("graph", [{"auto_reset_next_task": True}], indirect=True)
def test_auto_reset_next_task_goes_through_the_suite(graph):
    assert spin_until(graph.executor, lambda: graph.status)
    graph.finish_episode()
    assert spin_until(graph.executor, lambda: len(graph.keys()) == 2), graph.keys()
    _suite, task, _episode, seed = graph.keys()[-1]
    assert (task, seed) == (next_task(SUITE, TASK), 6)
    assert graph.sim.get_parameter("task").value == task  # ros2 param get agrees
    assert graph.status[-1][1].instruction  # the new task's instruction, for the policy


@pytest.mark.parametrize("graph", [{"auto_reset_delay_s": 30.0}], indirect=True)
def test_a_reset_during_the_pause_replaces_the_automatic_one(graph):
    assert spin_until(graph.executor, lambda: graph.status)
    graph.finish_episode()
    assert graph.reset.wait_for_service(timeout_sec=10)
    future = graph.reset.call_async(Trigger.Request())
    assert spin_until(graph.executor, future.done)
    assert future.result().success and "seed 6" in future.result().message
    assert graph.sim._auto_reset_at is None  # nothing pending: no second, surprise reset


@pytest.mark.parametrize("graph", [{"auto_reset": False}], indirect=True)
def test_without_auto_reset_the_episode_waits_for_reset(graph):
    assert spin_until(graph.executor, lambda: graph.status)
    graph.finish_episode()
    assert graph.sim._auto_reset_at is None
    assert len(graph.keys()) == 1


def test_config_and_task_order():
    assert SimNodeConfig().auto_reset is True  # the launched demo keeps running
    with pytest.raises(ValueError, match="auto_reset_delay_s"):
        SimNodeConfig(auto_reset_delay_s=-1.0)
    tasks = list_tasks(SUITE)
    assert [next_task(SUITE, t) for t in tasks] == tasks[1:] + tasks[:1]
    assert next_task(SUITE, "not_a_task") == tasks[0]
    with pytest.raises(ValueError, match="suite"):
        next_task("piper_nope", TASK)
