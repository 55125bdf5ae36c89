"""The retrieval node in its own process, called over real DDS from this test process.

The node runs from the installed wrapper ``nodes/retrieval_node`` under a launcher that blocks
``import torch`` (and reports any attempt), with the shipped ``config/retrieval_node.yaml``
plus test overrides, on a DDS domain no other test uses.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pytest

from test.ros_env import require_ros

rclpy, hmsg, hsrv = require_ros()

from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402

from heisd_ros.retrieval.records import records_from_episode  # noqa: E402
from heisd_ros.retrieval.retriever import Retriever, RetrieverConfig  # noqa: E402
from heisd_ros.retrieval.store import open_store  # noqa: E402
from heisd_ros.retrieval.store_config import StoreConfig  # noqa: E402
from test.node_process import NodeProcess, write_params  # noqa: E402
from test.polling import spin_until, wait_until  # noqa: E402

Retrieve = hsrv.Retrieve
REPO = Path(__file__).resolve().parents[1]
NODE_PROGRAM = REPO / "nodes" / "retrieval_node"
DIM, N, TASK, FP = 16, 24, "stack the blocks", "test-embedder:v1"
ID0 = 2**40  # point ids beyond 32 bits: the uint64 field must carry them
TIMEOUT_S = 30.0
TORCH_MARK = "HEISD_TORCH_IMPORT_ATTEMPTED"

# Runs the node program with torch blocked; prints a mark on any attempt to import it and,
# at exit, whether torch ended up in sys.modules at all.
LAUNCHER = f"""
import atexit, importlib.abc, runpy, sys
class BlockTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch":
            print("{TORCH_MARK} " + name, file=sys.stderr, flush=True)
            raise ImportError("torch is blocked: the retrieval node must not import it")
        return None
sys.meta_path.insert(0, BlockTorch())
atexit.register(lambda: print("HEISD_TORCH_LOADED=" + str("torch" in sys.modules),
                              file=sys.stderr, flush=True))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def build_db(path: Path, tasks: tuple[str, ...] = (TASK,), empty: tuple[str, ...] = ()):
    """A small edge DB at ``path``; returns the vectors and records of ``TASK``."""
    rng = np.random.default_rng(0)
    vecs = rng.normal(size=(N, DIM)).astype(np.float32)
    recs = records_from_episode(TASK, 3, rng.integers(0, 256, size=(N, 7)),
                                rng.normal(size=(N, 7)), rng.normal(size=(N, 3)))
    with open_store(StoreConfig(path=str(path), exact_search=True), create=True,
                    dimension=DIM, model_fingerprint=FP) as store:
        for task in tasks + empty:
            store.create_collection(task)
        for task in tasks:
            store.upsert(task, range(ID0, ID0 + N), vecs,
                         [{**r.to_payload(), "task": task} for r in recs])
        store.finalize()
    return vecs, recs


def wait_until_answering(executor, client, proc) -> None:
    """After ``wait_for_service``: the first answered request (the node answers every one).

    Discovery can report the service before the server has matched the client's response
    reader; a request sent in that window gets no answer (ros2/rmw_cyclonedds#187 describes
    the race), so the probe is repeated until one is answered.
    """
    deadline = time.monotonic() + TIMEOUT_S
    while call(executor, client, make_request(np.zeros(DIM)), timeout_s=2.0) is None:
        assert time.monotonic() < deadline, f"the service never answered: {proc.text()}"


def make_request(embedding, task: str = TASK, k: int = 0, deadline_ns: int = 0,
                 demoted=()) -> Retrieve.Request:
    """A Retrieve request (k = 0: the node's default k)."""
    req = Retrieve.Request(task=task, k=k, demoted_ids=[int(i) for i in demoted])
    req.embedding = np.asarray(embedding, dtype=np.float32).tolist()
    req.deadline.sec, req.deadline.nanosec = divmod(int(deadline_ns), 10**9)
    return req


def call(executor, client, request, timeout_s: float = TIMEOUT_S):
    """Call the service and return the response (None if none came within the timeout)."""
    future = client.call_async(request)
    executor.spin_until_future_complete(future, timeout_sec=timeout_s)
    if not future.done():
        client.remove_pending_request(future)
        return None
    return future.result()


class RetrievalProcess(NodeProcess):
    """The node program in a subprocess with torch blocked and the shipped YAML + ``params``."""

    def __init__(self, tmp: Path, domain: int, params: dict, *ros_args: str) -> None:
        self.params_file = write_params(tmp / "params.yaml", "retrieval_node", params,
                                        strict=False)
        super().__init__(["-c", LAUNCHER, str(NODE_PROGRAM), "--ros-args",
                          "--params-file", str(self.params_file), *ros_args], tmp, domain)


@pytest.fixture(scope="module")
def ros(module_ros_domain):
    """This process's side: a private context, a client node and an executor."""
    domain = module_ros_domain
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=domain)
    node = rclpy.create_node("retrieval_node_test_client", context=context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    yield domain, node, executor
    executor.shutdown()
    node.destroy_node()
    rclpy.shutdown(context=context)


@pytest.fixture(scope="module")
def served(ros, tmp_path_factory):
    """The node serving a real edge DB; the expected answers come from the library directly."""
    domain, node, executor = ros
    tmp = tmp_path_factory.mktemp("served")
    vecs, recs = build_db(tmp / "db", empty=("empty task",))
    queries = np.random.default_rng(1).normal(size=(4, DIM)).astype(np.float32)
    queries[0] = vecs[5]
    with open_store(StoreConfig(path=str(tmp / "db"), exact_search=True)) as store:
        direct = [Retriever(store, RetrieverConfig(k=4)).retrieve(TASK, q) for q in queries]
    # The store is closed again: the embedded DB is locked by one process at a time.
    proc = RetrievalProcess(tmp, domain, {"store.path": "db", "store.exact_search": True,
                                     "diagnostics_period_s": 0.2, "expected_dimension": DIM,
                                     "model_fingerprint": FP})
    client = node.create_client(Retrieve, "/retrieval_node/retrieve")
    assert client.wait_for_service(timeout_sec=TIMEOUT_S), proc.text()
    wait_until_answering(executor, client, proc)
    yield proc, client, vecs, recs, queries, direct
    node.destroy_client(client)
    code = proc.stop()
    assert code == 0, f"exit code {code}: {proc.text()}"
    assert TORCH_MARK not in proc.text()
    assert "HEISD_TORCH_LOADED=False" in proc.text(), proc.text()


def test_top_k_equals_the_library_and_fields_round_trip(ros, served):
    _, _, executor = ros
    _, client, _, recs, queries, direct = served
    for query, want in zip(queries, direct, strict=True):
        res = call(executor, client, make_request(query))  # k = 0: the YAML's retriever.k = 4
        assert res.status == Retrieve.Response.STATUS_OK and res.reason == ""
        assert [c.id for c in res.candidates] == [c.id for c in want.candidates]
        np.testing.assert_allclose([c.score for c in res.candidates],
                                   [c.score for c in want.candidates], atol=1e-6)
        assert res.latency_ms > 0
    first = call(executor, client, make_request(queries[0], k=2))
    assert len(first.candidates) == 2
    cand, rec = first.candidates[0], recs[5]
    assert cand.id == ID0 + 5 and cand.score == pytest.approx(1.0, abs=1e-5)
    assert (cand.task, cand.episode, cand.step) == (TASK, 3, 5)
    assert list(cand.bins) == rec.bins.tolist()
    np.testing.assert_allclose(cand.action, rec.action, rtol=1e-6)
    assert len(rec.lookahead_bins) == 3
    assert list(cand.lookahead_bins) == rec.lookahead_bins.reshape(-1).tolist()  # row-major
    np.testing.assert_allclose(cand.lookahead_actions, rec.lookahead_actions.reshape(-1),
                               rtol=1e-6)
    ee = cand.ee_position_m
    np.testing.assert_allclose([ee.x, ee.y, ee.z], rec.ee_position_m)


def test_demoted_ids_rank_last(ros, served):
    _, _, executor = ros
    _, client, vecs, _, _, _ = served
    plain = call(executor, client, make_request(vecs[5], k=3))
    top = plain.candidates[0].id
    res = call(executor, client, make_request(vecs[5], k=3, demoted=[top]))
    assert res.status == Retrieve.Response.STATUS_OK
    assert top not in [c.id for c in res.candidates]  # it sank below k others
    assert [c.id for c in res.candidates][:2] == [c.id for c in plain.candidates][1:]


@pytest.mark.parametrize("task, dim, words", [
    ("no such task", DIM, ["no collection", "'no such task'"]),
    ("empty task", DIM, ["holds no points", "'empty task'"]),
])
def test_missing_or_empty_collection_is_empty_with_the_task(ros, served, task, dim, words):
    _, _, executor = ros
    client = served[1]
    res = call(executor, client, make_request(np.ones(dim), task=task))
    assert res.status == Retrieve.Response.STATUS_EMPTY
    assert all(w in res.reason for w in words), res.reason
    assert len(res.candidates) == 0


def test_bad_requests_name_the_problem_and_the_node_keeps_serving(ros, served):
    _, _, executor = ros
    _, client, vecs, _, _, _ = served
    res = call(executor, client, make_request(np.ones(DIM + 3)))
    assert res.status == Retrieve.Response.STATUS_BAD_REQUEST
    assert f"expected {DIM} values" in res.reason and f"({DIM + 3},)" in res.reason
    nan = np.ones(DIM)
    nan[2] = math.nan
    res = call(executor, client, make_request(nan))
    assert res.status == Retrieve.Response.STATUS_BAD_REQUEST and "finite" in res.reason
    res = call(executor, client, make_request(vecs[0], k=1000))
    assert res.status == Retrieve.Response.STATUS_BAD_REQUEST and "k:" in res.reason
    res = call(executor, client, make_request(vecs[0]))
    assert res.status == Retrieve.Response.STATUS_OK and res.candidates[0].id == ID0


def test_deadline_of_one_nanosecond_returns_what_was_found(ros, served):
    _, _, executor = ros
    _, client, vecs, _, _, _ = served
    res = call(executor, client, make_request(vecs[7], k=3, deadline_ns=1))
    assert res.status == Retrieve.Response.STATUS_DEADLINE_EXCEEDED
    assert "budget" in res.reason
    assert [c.id for c in res.candidates][:1] == [ID0 + 7] and len(res.candidates) == 3


def test_diagnostics_report_db_counts_and_latency(ros, served):
    _, node, executor = ros
    _, client, vecs, _, _, _ = served
    for _ in range(3):
        call(executor, client, make_request(vecs[1]))
    seen = []
    sub = node.create_subscription(DiagnosticArray, "/diagnostics", seen.append, 10)

    def latest():
        for msg in reversed(seen):
            for status in msg.status:
                if status.name.startswith("retrieval_node"):
                    return status, {kv.key: kv.value for kv in status.values}
        return None, {}

    spin_until(executor, lambda: "latency_p99_ms" in latest()[1], TIMEOUT_S)
    node.destroy_subscription(sub)
    status, values = latest()
    assert status is not None, "no diagnostics from the node"
    assert status.level == status.OK and values["db_status"] == "open"
    assert values[f"count[{TASK}]"] == str(N) and values["count[empty task]"] == "0"
    assert values["collections"] == "2" and values["dimension"] == str(DIM)
    assert int(values["requests_in_window"]) >= 3
    assert float(values["latency_p99_ms"]) >= float(values["latency_p50_ms"]) > 0


def test_missing_db_errors_then_picks_up_a_db_built_later_and_a_killed_node_times_out(
        ros, tmp_path):
    domain, node, executor = ros
    proc = RetrievalProcess(tmp_path, domain, {"store.path": "later_db", "reopen_period_s": 0.3,
                                          "diagnostics_period_s": 0.0},
                       "-r", "__node:=late_retrieval")
    client = node.create_client(Retrieve, "/late_retrieval/retrieve")  # the remapped name
    try:
        assert client.wait_for_service(timeout_sec=TIMEOUT_S), proc.text()
        wait_until_answering(executor, client, proc)
        query = np.ones(DIM)
        for _ in range(2):  # every request is answered, with the reason
            res = call(executor, client, make_request(query))
            assert res.status == Retrieve.Response.STATUS_ERROR, res.reason
            assert str(tmp_path / "later_db") in res.reason
            assert "does not exist" in res.reason
        # Build elsewhere, then move into place: the node never sees a half-built DB.
        vecs, _ = build_db(tmp_path / "building")
        (tmp_path / "building").rename(tmp_path / "later_db")
        answers = []

        def picked_up() -> bool:
            answers.append(call(executor, client, make_request(vecs[2])))
            return answers[-1] is not None and answers[-1].status == Retrieve.Response.STATUS_OK

        assert wait_until(picked_up, TIMEOUT_S, poll_s=0.2), f"DB never picked up: {proc.text()}"
        # every request before was answered, with an error
        assert all(r is not None and r.status == Retrieve.Response.STATUS_ERROR
                   for r in answers[:-1]), [r and r.reason for r in answers]
        res = answers[-1]
        assert res.candidates[0].id == ID0 + 2
        assert proc.text().count("retrying every") == 1  # logged once, not per retry
        assert TORCH_MARK not in proc.text()

        proc.proc.kill()  # no goodbye: the policy node must not hang on a dead server
        proc.proc.wait(timeout=10)
        res = call(executor, client, make_request(vecs[2]), timeout_s=1.0)
        assert res is None  # the call returned without an answer instead of blocking
        assert call(executor, client, make_request(vecs[2]), timeout_s=0.5) is None
    finally:
        node.destroy_client(client)
        proc.stop()
