"""The retrieval node in this process (private context, real DDS): parameters and failures."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import yaml

from test.polling import spin_until
from test.ros_env import require_ros

rclpy, hmsg, hsrv = require_ros()

from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from rclpy.executors import MultiThreadedExecutor, SingleThreadedExecutor  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402

from heisd_ros.nodes.retrieval_node import RetrievalNode, RetrievalNodeConfig  # noqa: E402
from heisd_ros.retrieval.errors import BackendError, RetrievalStatus  # noqa: E402
from heisd_ros.retrieval.retriever import RetrieverConfig  # noqa: E402
from heisd_ros.retrieval.store import open_store  # noqa: E402
from heisd_ros.retrieval.store_config import StoreConfig  # noqa: E402
from test.test_node_retrieval import (  # noqa: E402
    DIM,
    FP,
    ID0,
    REPO,
    TASK,
    build_db,
    call,
    make_request,
)

Retrieve = hsrv.Retrieve
YAML = REPO / "config" / "retrieval_node.yaml"


def _flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        out.update(_flatten(value, name + ".") if isinstance(value, dict) else {name: value})
    return out


@pytest.fixture(scope="module")
def ros(module_ros_domain):
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=module_ros_domain)
    client_node = rclpy.create_node("retrieval_inprocess_client", context=context)
    yield context, client_node
    client_node.destroy_node()
    rclpy.shutdown(context=context)


@pytest.fixture(scope="module")
def db_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("inprocess") / "db"
    build_db(path)
    return path


@pytest.fixture
def start(ros):
    """Start a RetrievalNode with parameters; yields a function that calls its service."""
    context, client_node = ros
    started = []

    def _start(params: dict, **kwargs):
        overrides = [Parameter(name, value=value) for name, value in params.items()]
        node = RetrievalNode(context=context, parameter_overrides=overrides, **kwargs)
        executor = SingleThreadedExecutor(context=context)
        executor.add_node(node)
        executor.add_node(client_node)
        client = client_node.create_client(Retrieve, "/retrieval_node/retrieve")
        started.append((node, executor, client))
        assert client.wait_for_service(timeout_sec=30)
        return node, lambda request: call(executor, client, request)

    yield _start
    for node, executor, client in started:
        client_node.destroy_client(client)
        executor.shutdown()
        node.destroy_node()


def test_library_status_numbers_are_the_service_constants():
    assert {s.name: s.value for s in RetrievalStatus} == {
        name[len("STATUS_"):]: getattr(Retrieve.Response, name)
        for name in dir(Retrieve.Response) if name.startswith("STATUS_")}


def test_shipped_yaml_declares_only_known_parameters_with_valid_values(start, tmp_path,
                                                                       monkeypatch):
    params = _flatten(yaml.safe_load(YAML.read_text())["retrieval_node"]["ros__parameters"])
    monkeypatch.chdir(tmp_path)  # the YAML's relative DB path: against the working dir
    node, retrieve = start(params)
    unknown = [name for name in params if not node.has_parameter(name)]
    assert unknown == [], f"config/retrieval_node.yaml sets undeclared parameters {unknown}"
    assert node.store_config == StoreConfig(**{
        **{k[6:]: v for k, v in params.items() if k.startswith("store.")},
        "path": str(tmp_path / "heisd_db")})
    assert node.retriever_config == RetrieverConfig(
        **{k[10:]: v for k, v in params.items() if k.startswith("retriever.")})
    assert node.config == RetrievalNodeConfig(
        **{k: v for k, v in params.items() if "." not in k})
    # No DB there: the node runs and says where it looked.
    res = retrieve(make_request(np.ones(DIM)))
    assert res.status == Retrieve.Response.STATUS_ERROR
    assert str(tmp_path / "heisd_db") in res.reason
    assert node.describe_parameter("store.path").read_only


@pytest.mark.parametrize("params, words", [
    ({"store.backend": "faiss", "store.path": "x"}, ["backend", "'faiss'", "'edge', 'qdrant'"]),
    ({"store.path": "x", "retriever.k": "four"}, ["retriever.k", "four"]),
    ({"store.path": "x", "store.timeout_s": "soon"}, ["store.timeout_s", "soon"]),
    ({"store.path": "x", "latency_window": 0}, ["latency_window", "got 0"]),
])
def test_invalid_parameters_become_an_error_status(start, params, words):
    node, retrieve = start(params)
    assert not node.db_ready
    res = retrieve(make_request(np.ones(DIM)))
    assert res.status == Retrieve.Response.STATUS_ERROR
    assert all(w in res.reason for w in words), res.reason
    assert node.diagnostic_status().level == node.diagnostic_status().ERROR


def test_a_float_parameter_accepts_an_integer(start, db_path):
    node, _ = start({"store.path": str(db_path), "store.timeout_s": 3,
                     "default_deadline_ms": 20})
    assert node.db_ready and node.store_config.timeout_s == 3.0
    assert node.config.default_deadline_ms == 20.0


@pytest.mark.parametrize("params, words", [
    ({"expected_dimension": DIM * 2}, [f"dimension: DB has {DIM}, expected {DIM * 2}"]),
    ({"model_fingerprint": "other-embedder"}, [repr(FP), "'other-embedder'"]),
])
def test_a_db_built_differently_is_refused(start, db_path, params, words):
    node, retrieve = start({"store.path": str(db_path), **params})
    assert not node.db_ready
    res = retrieve(make_request(np.ones(DIM)))
    assert res.status == Retrieve.Response.STATUS_ERROR
    assert str(db_path) in res.reason and all(w in res.reason for w in words), res.reason
    diag = node.diagnostic_status()
    assert diag.level == diag.ERROR and all(w in diag.message for w in words)


class FlakyStore:
    """A real store whose first search fails like an unreachable server."""

    def __init__(self, store) -> None:
        self.store, self.failures = store, 1

    def __getattr__(self, name):
        return getattr(self.store, name)

    def search(self, *args, **kwargs):
        if self.failures:
            self.failures -= 1
            raise BackendError("search 'stack the blocks' failed at qdrant:http://db:6333: "
                               "connection refused")
        return self.store.search(*args, **kwargs)


def test_a_backend_failure_is_an_error_and_the_next_request_works(start, db_path):
    node, retrieve = start({"store.path": str(db_path)},
                           store_opener=lambda cfg, **kw: FlakyStore(open_store(cfg, **kw)))
    query = np.ones(DIM)
    res = retrieve(make_request(query))
    assert res.status == Retrieve.Response.STATUS_ERROR and "connection refused" in res.reason
    res = retrieve(make_request(query))
    assert res.status == Retrieve.Response.STATUS_OK and len(res.candidates) == 4
    values = {kv.key: kv.value for kv in node.diagnostic_status().values}
    assert values["requests[ERROR]"] == "1" and values["requests[OK]"] == "1"


def test_default_deadline_applies_only_to_a_zero_deadline(start, db_path):
    _, retrieve = start({"store.path": str(db_path), "default_deadline_ms": 1e-6})
    res = retrieve(make_request(np.ones(DIM), k=2))
    assert res.status == Retrieve.Response.STATUS_DEADLINE_EXCEEDED
    assert len(res.candidates) == 2
    res = retrieve(make_request(np.ones(DIM), k=2, deadline_ns=60 * 10**9))
    assert res.status == Retrieve.Response.STATUS_OK and res.candidates[0].id >= ID0


@pytest.mark.filterwarnings("ignore::UserWarning")  # qdrant-client: key over plain http
def test_api_key_is_never_logged_or_reported(start, capfd):
    secret = "s3cret-api-key-do-not-print"
    node, retrieve = start({"store.backend": "qdrant", "store.url": "http://127.0.0.1:9",
                            "store.api_key": secret, "store.timeout_s": 1.0,
                            "reopen_period_s": 0.0})
    res = retrieve(make_request(np.ones(DIM), task=TASK))
    assert res.status == Retrieve.Response.STATUS_ERROR and "127.0.0.1:9" in res.reason
    diag = node.diagnostic_status()
    out, err = capfd.readouterr()
    assert "127.0.0.1:9" in err  # the failure was logged...
    assert secret not in out + err + res.reason + str(diag)  # ...without the key


def test_a_slow_search_does_not_hold_up_diagnostics(ros, db_path):
    context, client_node = ros
    entered, release = threading.Event(), threading.Event()

    class SlowStore(FlakyStore):
        def search(self, *args, **kwargs):
            entered.set()
            release.wait(timeout=60)
            return self.store.search(*args, **kwargs)

    node = RetrievalNode(context=context, store_opener=lambda cfg, **kw: SlowStore(
        open_store(cfg, **kw)), parameter_overrides=[
            Parameter("store.path", value=str(db_path)),
            Parameter("diagnostics_period_s", value=0.05)])
    node_executor = MultiThreadedExecutor(num_threads=2, context=context)  # as in main()
    node_executor.add_node(node)
    spinner = threading.Thread(target=node_executor.spin, daemon=True)
    spinner.start()
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(client_node)
    client = client_node.create_client(Retrieve, "/retrieval_node/retrieve")
    seen = []
    sub = client_node.create_subscription(DiagnosticArray, "/diagnostics", seen.append, 10)

    try:
        assert client.wait_for_service(timeout_sec=30)
        future = client.call_async(make_request(np.ones(DIM)))
        assert spin_until(executor, entered.is_set, 30), "the search never started"
        count = len(seen)
        assert spin_until(executor, lambda: len(seen) >= count + 3, 30), \
            "no diagnostics during the search"
        assert not future.done()  # the search was still blocked all along
        release.set()
        assert spin_until(executor, future.done, 30), "no response"
        assert future.result().status == Retrieve.Response.STATUS_OK
    finally:
        release.set()
        client_node.destroy_subscription(sub)
        client_node.destroy_client(client)
        executor.shutdown()
        node_executor.shutdown()
        spinner.join(timeout=10)
        node.destroy_node()
