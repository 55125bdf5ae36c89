"""The retrieval fault stand-in in its own process, called over real DDS from this test process.

``python -m heisd_ros.nodes.retrieval_fault`` serves ``/retrieval_node/retrieve`` (the retrieval
node's service): ``empty`` answers OK with no candidates, ``slow`` answers OK too, but only after
its delay.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from test.ros_env import require_ros

rclpy, hmsg, hsrv = require_ros()

from rclpy.executors import SingleThreadedExecutor  # noqa: E402

from test.node_process import NodeProcess  # noqa: E402

Retrieve = hsrv.Retrieve
SERVICE = "/retrieval_node/retrieve"
TIMEOUT_S = 30.0
SLOW_DELAY_S = 0.3


@pytest.fixture
def client_side(ros_domain):
    """This process's side on the test's domain: a client node, its executor, its client."""
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=ros_domain)
    node = rclpy.create_node("retrieval_fault_test_client", context=context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    client = node.create_client(Retrieve, SERVICE)
    yield ros_domain, executor, client
    node.destroy_client(client)
    executor.shutdown()
    node.destroy_node()
    rclpy.shutdown(context=context)


def request() -> Retrieve.Request:
    """A request as the policy sends it (embedding, task, k, a 50 ms deadline)."""
    req = Retrieve.Request(task="put the red block on the plate", k=4)
    req.embedding = np.full(16, 0.25, dtype=np.float32).tolist()
    req.deadline.nanosec = 50_000_000
    return req


def call(executor, client, timeout_s: float):
    """(response or None, seconds from the call to its answer), waiting on the future."""
    t0 = time.monotonic()
    future = client.call_async(request())
    executor.spin_until_future_complete(future, timeout_sec=timeout_s)
    elapsed_s = time.monotonic() - t0
    if not future.done():
        client.remove_pending_request(future)
        return None, elapsed_s
    return future.result(), elapsed_s


def start_fault_server(tmp_path, domain: int, executor, client, *mode_args: str) -> NodeProcess:
    """The stand-in, once it has answered a first request.

    Discovery can report the service before the server matched the client's response reader;
    a request sent then gets no answer, so the probe repeats until one is answered (the same
    race as in test_node_retrieval.py).
    """
    proc = NodeProcess(["-m", "heisd_ros.nodes.retrieval_fault", *mode_args], tmp_path, domain)
    assert client.wait_for_service(timeout_sec=TIMEOUT_S), proc.text()
    deadline = time.monotonic() + TIMEOUT_S
    while call(executor, client, timeout_s=2.0 + SLOW_DELAY_S)[0] is None:
        assert proc.proc.poll() is None, f"the stand-in exited: {proc.text()}"
        assert time.monotonic() < deadline, f"the stand-in never answered: {proc.text()}"
    return proc


def stop_cleanly(proc: NodeProcess) -> None:
    code = proc.stop()
    assert code == 0, f"exit code {code}: {proc.text()}"
    assert "requests answered" in proc.text(), proc.text()


def test_empty_answers_ok_without_candidates(client_side, tmp_path):
    domain, executor, client = client_side
    proc = start_fault_server(tmp_path, domain, executor, client, "--mode", "empty")
    try:
        res, _ = call(executor, client, timeout_s=TIMEOUT_S)
        assert res is not None, f"no answer within {TIMEOUT_S} s: {proc.text()}"
        assert res.status == Retrieve.Response.STATUS_OK
        assert len(res.candidates) == 0
        assert res.reason.startswith("fault injection")
    finally:
        stop_cleanly(proc)


def test_slow_answers_ok_but_not_before_its_delay(client_side, tmp_path):
    domain, executor, client = client_side
    proc = start_fault_server(tmp_path, domain, executor, client, "--mode", "slow",
                              "--delay-s", str(SLOW_DELAY_S))
    try:
        res, elapsed_s = call(executor, client, timeout_s=TIMEOUT_S)
        assert res is not None, f"no answer within {TIMEOUT_S} s: {proc.text()}"
        assert res.status == Retrieve.Response.STATUS_OK and len(res.candidates) == 0
        assert elapsed_s >= SLOW_DELAY_S, f"answered after {elapsed_s:.3f} s"
        assert res.reason.startswith("fault injection: answered after "), res.reason
        assert res.latency_ms >= SLOW_DELAY_S * 1e3
    finally:
        stop_cleanly(proc)


def test_the_policy_client_stops_asking_a_service_that_misses_its_deadlines(tmp_path,
                                                                            client_side):
    """After 3 missed deadlines in a row the client falls back at once for a while."""
    from heisd_ros.nodes.retrieval_client import RetrievalServiceClient
    from heisd_ros.retrieval.errors import RetrievalStatus

    domain, executor, client = client_side
    server = start_fault_server(tmp_path, domain, executor, client, "--mode", "slow",
                                "--delay-s", str(SLOW_DELAY_S))
    node = executor.get_nodes()[0]
    policy_side = RetrievalServiceClient(node, SERVICE, backoff_after=3, backoff_s=60.0)
    embedding = np.full(16, 0.25, dtype=np.float32)
    import threading

    finished = rclpy.task.Future()  # the executor completes the client's futures meanwhile
    spin = threading.Thread(target=executor.spin_until_future_complete,
                            args=(finished, TIMEOUT_S), daemon=True)
    spin.start()
    try:
        results = [policy_side.retrieve("t", embedding, k=4, deadline_s=0.05) for _ in range(5)]
    finally:
        finished.set_result(None)
        executor.wake()
        spin.join(timeout=TIMEOUT_S)
        server.stop()
    assert [r.status for r in results] == [RetrievalStatus.DEADLINE_EXCEEDED] * 5
    assert all("no answer from" in r.reason for r in results[:3]), [r.reason for r in results]
    assert all("missed 3 deadlines in a row: not asked" in r.reason for r in results[3:])
    assert policy_side.requests_sent == 3
