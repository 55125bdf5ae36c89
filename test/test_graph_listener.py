"""The graph tools' one listener: every topic it subscribes to, over real DDS, no launch.

A publisher node and the listener (on its own executor thread) share a private context on a
domain of their own; what the listener records is compared with what was sent. The window
selection and the age of a command are checked on its callbacks with a manual clock.
"""

from __future__ import annotations

import pytest

from test.polling import spin_until
from test.ros_env import require_ros

rclpy, hmsg, _ = require_ros()

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from sensor_msgs.msg import Image, JointState  # noqa: E402

from heisd_ros.nodes.qos import STATUS_QOS  # noqa: E402
from heisd_ros.nodes.sim_node import THIRD_PERSON_TOPIC, WRIST_TOPIC  # noqa: E402
from heisd_ros.tools.graph.listener import (  # noqa: E402
    CAMERAS,
    POLICY_DIAGNOSTICS,
    STAGES,
    GraphListener,
    Status,
)

TIMEOUT_S = 30.0


@pytest.fixture
def graph(ros_domain):
    """(publisher node, its executor, a listener of every topic on its own thread)."""
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=ros_domain)
    node = rclpy.create_node("heisd_listener_test_peer", context=context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    listener = GraphListener.on_own_thread(context, "heisd_listener_test", cameras=True,
                                           robot_state=True, episodes=True)
    yield node, executor, listener
    listener.close()
    executor.shutdown()
    node.destroy_node()
    rclpy.shutdown(context=context)


def _stamp(msg, sec: int, nanosec: int):
    msg.header.stamp.sec, msg.header.stamp.nanosec = sec, nanosec
    return msg


def _publish_until(executor, publisher, msg, received) -> bool:
    """Publish ``msg`` until ``received()`` holds (the first ones may precede discovery)."""
    def sent() -> bool:
        if received():
            return True
        publisher.publish(msg)
        return False
    return spin_until(executor, sent, TIMEOUT_S, spin_s=0.1)


def test_every_topic_is_recorded_with_its_stamp(graph):
    node, executor, listener = graph
    command = _stamp(hmsg.EECommand(step_index=3), 100, 250_000_000)
    pub = node.create_publisher(hmsg.EECommand, "/heisd/ee_command", 10)
    assert _publish_until(executor, pub, command, lambda: listener.commands), "no EECommand"
    got = listener.commands[0]
    assert got.stamp_s == pytest.approx(100.25)
    assert got.age_s == pytest.approx(got.arrival_s - 100.25)

    step = _stamp(hmsg.HybridStep(total_ms=12.5, verify_skipped=True, status="retrieval empty",
                                  draft_source=2, verify_ms=4.0, behind_result=1,
                                  behind_wait_ms=0.5), 7, 5)
    pub = node.create_publisher(hmsg.HybridStep, "/heisd/hybrid_step", 10)
    assert _publish_until(executor, pub, step, lambda: listener.steps), "no HybridStep"
    s = listener.steps[0]
    assert s.stamp_ns == 7_000_000_005 and s.total_ms == 12.5 and s.unverified
    assert (s.status, s.draft_source, s.behind_result) == ("retrieval empty", 2, 1)
    assert set(s.stages) == set(STAGES) and s.stages["verify_ms"] == 4.0

    diag = DiagnosticArray(status=[DiagnosticStatus(
        level=DiagnosticStatus.WARN, name=POLICY_DIAGNOSTICS, message="held",
        values=[KeyValue(key="refused[stale command]", value="4")])])
    pub = node.create_publisher(DiagnosticArray, "/diagnostics", 10)
    assert _publish_until(executor, pub, diag, lambda: listener.diagnostics_of(
        POLICY_DIAGNOSTICS)), "no diagnostics"
    assert listener.diagnostics_of(POLICY_DIAGNOSTICS) == {"refused[stale command]": "4",
                                                           "message": "held"}
    assert listener.diagnostic_levels() == {POLICY_DIAGNOSTICS: 1}
    assert POLICY_DIAGNOSTICS in listener.diagnostics_at

    status = _stamp(hmsg.EpisodeStatus(suite="piper_goal", task="t", episode=2, seed=9, step=40,
                                       done=True, success=True, reason="success"), 30, 0)
    pub = node.create_publisher(hmsg.EpisodeStatus, "/heisd/episode_status", STATUS_QOS)
    assert _publish_until(executor, pub, status, lambda: listener.statuses), "no status"
    assert listener.statuses[0] == Status(30.0, ("piper_goal", "t", 2, 9), 40, True, True,
                                          "success")

    for camera, topic in zip(CAMERAS, (THIRD_PERSON_TOPIC, WRIST_TOPIC), strict=True):
        image = _stamp(Image(height=1, width=1, encoding="rgb8", step=3, data=[1, 2, 3]),
                       12, 345_000_000)
        pub = node.create_publisher(Image, topic, 10)
        assert _publish_until(executor, pub, image, lambda c=camera: listener.frames[c]), camera
        assert listener.frames[camera][0][1] == pytest.approx(12.345)
    pub = node.create_publisher(JointState, "/joint_states", 10)
    assert _publish_until(executor, pub, JointState(), lambda: listener.states), "no state"


def test_window_selection_and_command_age_on_the_callbacks(graph):
    _, _, listener = graph
    now = {"s": 10.0}
    listener._clock = lambda: now["s"]  # arrival times from a manual clock
    listener.commands.clear()
    listener.steps.clear()
    for t in (10.0, 11.0, 12.0):
        now["s"] = t
        listener.on_command(_stamp(hmsg.EECommand(), int(t) - 1, 500_000_000))
        listener.on_step(_stamp(hmsg.HybridStep(total_ms=t), int(t), 0))
    window = listener.commands_between(10.5, 12.0)
    assert [c.arrival_s for c in window] == [11.0, 12.0]
    assert [c.age_s for c in window] == [pytest.approx(0.5)] * 2
    assert [s.total_ms for s in listener.steps_between(0.0, 10.0)] == [10.0]
