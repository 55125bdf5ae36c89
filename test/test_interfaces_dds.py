"""Every custom message and both services cross a real DDS link between two processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from test.node_process import repo_env
from test.polling import spin_until
from test.ros_env import require_ros

rclpy, hmsg, hsrv = require_ros()

from rclpy.executors import SingleThreadedExecutor  # noqa: E402

from test.dds_peer import QOS  # noqa: E402
from test.ros_msg_utils import fill_random  # noqa: E402

MSG_TYPES = (hmsg.EECommand, hmsg.EpisodeStatus, hmsg.HybridStep, hmsg.RetrievalCandidate)
PEER = Path(__file__).with_name("dds_peer.py")
TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def ros(tmp_path_factory, module_ros_domain):
    """A peer process and a node of ours, on a DDS domain no other test uses."""
    domain = module_ros_domain  # the peer is given it: it must not allocate one of its own
    env = repo_env()
    peer_log = tmp_path_factory.mktemp("dds_peer") / "stderr.log"
    with open(peer_log, "w") as stderr:
        peer = subprocess.Popen([sys.executable, str(PEER), str(domain)], stdout=subprocess.PIPE,
                                stderr=stderr, text=True, env=env)
    assert peer.stdout.readline().strip() == "ready", peer_log.read_text()
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=domain)
    node = rclpy.create_node("heisd_dds_test", context=context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    yield node, executor
    assert peer.poll() is None, f"the peer process died: {peer_log.read_text()}"
    executor.shutdown()
    node.destroy_node()
    rclpy.shutdown(context=context)
    peer.terminate()
    peer.wait(timeout=10)


@pytest.mark.parametrize("msg_type", MSG_TYPES, ids=lambda t: t.__name__)
def test_message_round_trip_is_exact(ros, msg_type):
    node, executor = ros
    topic = f"/heisd_test/{msg_type.__name__}"
    received = []
    pub = node.create_publisher(msg_type, topic, QOS)
    sub = node.create_subscription(msg_type, topic + "_echo", received.append, QOS)
    assert spin_until(executor, lambda: pub.get_subscription_count() > 0
                      and sub.get_publisher_count() > 0, TIMEOUT_S), f"no discovery on {topic}"
    rng = np.random.default_rng(len(msg_type.__name__))
    sent = [fill_random(msg_type(), rng) for _ in range(5)]
    for msg in sent:
        pub.publish(msg)
    assert spin_until(executor, lambda: len(received) >= len(sent), TIMEOUT_S), \
        f"no echoes on {topic}_echo"
    for original, echoed in zip(sent, received, strict=True):
        assert echoed == original
    # The comparison is not vacuous: a changed field is seen.
    tampered = received[0]
    first_field = next(iter(msg_type.get_fields_and_field_types()))
    setattr(tampered, first_field, getattr(fill_random(msg_type(), rng), first_field))
    assert tampered != sent[0] or first_field == "header"
    node.destroy_publisher(pub)
    node.destroy_subscription(sub)


def _call(node, executor, srv_type, name, request):
    client = node.create_client(srv_type, name)
    assert spin_until(executor, client.service_is_ready, TIMEOUT_S), f"no service {name}"
    future = client.call_async(request)
    assert spin_until(executor, future.done, TIMEOUT_S), f"no response from {name}"
    node.destroy_client(client)
    return future.result()


def test_retrieve_service_carries_every_request_field(ros):
    node, executor = ros
    rng = np.random.default_rng(7)
    request = fill_random(hsrv.Retrieve.Request(), rng)
    request.k = 3
    request.embedding = np.float32(rng.normal(size=16)).tolist()
    request.demoted_ids = [11, 2**63 + 5]
    request.deadline.sec, request.deadline.nanosec = 2, 500_000_000
    response = _call(node, executor, hsrv.Retrieve, "/heisd_test/retrieve", request)
    assert response.status == hsrv.Retrieve.Response.STATUS_OK
    assert response.reason == ""
    assert len(response.candidates) == 3
    for i, cand in enumerate(response.candidates):
        assert cand.id == request.demoted_ids[i % 2]
        assert cand.score == request.embedding[i]
        assert cand.task == request.task
        assert (cand.episode, cand.step) == (request.deadline.sec, request.deadline.nanosec)
        assert list(cand.lookahead_actions) == list(request.embedding)
    assert response.latency_ms == 16.0

    empty = hsrv.Retrieve.Request(task="no_such_task", k=0)
    response = _call(node, executor, hsrv.Retrieve, "/heisd_test/retrieve", empty)
    assert response.status == hsrv.Retrieve.Response.STATUS_EMPTY
    assert "no_such_task" in response.reason and not response.candidates


def test_set_instruction_service(ros):
    node, executor = ros
    request = hsrv.SetInstruction.Request(instruction="put the red block in the bowl",
                                          task="spatial/red_block_bowl")
    response = _call(node, executor, hsrv.SetInstruction, "/heisd_test/set_instruction", request)
    assert response.success
    assert response.message == "put the red block in the bowl|spatial/red_block_bowl"
