r"""The retrieval node: serves top-K retrieval drafts from the vector DB (CPU only, no torch).

A thin adapter over :class:`heisd_ros.retrieval.retriever.Retriever`: it converts a
``heisd_ros/srv/Retrieve`` request, calls the library, and turns the result (never an
exception) into the response's status, reason and candidates.

Usage::

    ros2 run heisd_ros retrieval_node --ros-args \
        --params-file $(ros2 pkg prefix heisd_ros)/share/heisd_ros/config/retrieval_node.yaml \
        -p store.path:=/data/heisd_db
    # a Qdrant server instead of the embedded DB:
    ros2 run heisd_ros retrieval_node --ros-args -p store.backend:=qdrant \
        -p store.path:='' -p store.url:=http://db:6333

Interface:
    ``~/retrieve`` (heisd_ros/srv/Retrieve): ``k = 0`` asks for ``retriever.k`` candidates; a
        zero deadline means ``default_deadline_ms`` (0 there = no deadline).
    ``/diagnostics`` (diagnostic_msgs/DiagnosticArray): DB status, collections with their
        point counts, latency p50/p99 over the last ``latency_window`` requests.

A DB that cannot be opened (missing path, server unreachable, dimension or model fingerprint
different from the expected ones) does not stop the node: it logs the reason, answers every
request with STATUS_ERROR and that reason, and retries every ``reopen_period_s`` so a DB built
or fixed later is picked up. Invalid parameters are handled the same way, without retries.
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.node import Node

from heisd_ros.msg import RetrievalCandidate
from heisd_ros.nodes._params import dataclass_from_parameters
from heisd_ros.nodes._spin import spin_node
from heisd_ros.retrieval.errors import RetrievalStatus, StoreError
from heisd_ros.retrieval.records import Candidate
from heisd_ros.retrieval.retriever import RetrievalResult, Retriever, RetrieverConfig
from heisd_ros.retrieval.store import VectorStore, open_store
from heisd_ros.retrieval.store_config import StoreConfig
from heisd_ros.srv import Retrieve

# Retriever fields that only feed its in-process rejection memory; the node takes demoted ids
# from each request instead, so these would be parameters without effect.
_UNUSED_RETRIEVER_FIELDS = ("demote_steps", "demote_same_bins")

StoreOpener = Callable[..., VectorStore]


@dataclass(frozen=True)
class RetrievalNodeConfig:
    """Serving settings of the retrieval node (the DB and ranking have their own configs).

    Attributes:
        default_deadline_ms: time budget of a request whose deadline is zero, in ms
            (0 = no deadline).
        expected_dimension: embedding dimension the DB must have; 0 = accept the DB's.
        model_fingerprint: embedding model the DB must have been built with; "" = any.
        reopen_period_s: retry opening an unavailable DB this often, in s (0 = never).
        diagnostics_period_s: period of the /diagnostics message, in s (0 = none).
        latency_window: requests over which latency p50/p99 are reported.
    """

    default_deadline_ms: float = 0.0
    expected_dimension: int = 0
    model_fingerprint: str = ""
    reopen_period_s: float = 2.0
    diagnostics_period_s: float = 1.0
    latency_window: int = 200

    def __post_init__(self) -> None:
        for name in ("default_deadline_ms", "reopen_period_s", "diagnostics_period_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}: expected a finite value >= 0, got {value}")
        if self.expected_dimension < 0:
            raise ValueError(f"expected_dimension: expected >= 0 (0 = any), "
                             f"got {self.expected_dimension}")
        if self.latency_window < 1:
            raise ValueError(f"latency_window: expected >= 1, got {self.latency_window}")


def describe_location(config: StoreConfig) -> str:
    """Where the DB is, for logs and diagnostics (never includes the API key)."""
    return f"{config.backend}:{config.url or config.path}"


def absolute_path(config: StoreConfig) -> StoreConfig:
    """``config`` with its DB directory resolved against the working directory (and ``~``).

    Done once at start so that logs and reasons name the directory actually used.
    """
    if not config.path or config.path == ":memory:":
        return config
    return dataclasses.replace(config, path=os.path.abspath(os.path.expanduser(config.path)))


def candidate_to_msg(candidate: Candidate) -> RetrievalCandidate:
    """One library candidate as a message (lookahead (n, 7) flattened row-major)."""
    rec = candidate.record
    msg = RetrievalCandidate(id=int(candidate.id), score=float(candidate.score), task=rec.task,
                             episode=rec.episode, step=rec.step)
    msg.bins = rec.bins
    msg.action = rec.action.astype(np.float32)
    msg.lookahead_bins = rec.lookahead_bins.reshape(-1).tolist()
    msg.lookahead_actions = rec.lookahead_actions.reshape(-1).astype(np.float32).tolist()
    msg.ee_position_m.x, msg.ee_position_m.y, msg.ee_position_m.z = (
        float(v) for v in rec.ee_position_m)
    return msg


def deadline_s(request: Retrieve.Request, default_ms: float) -> float | None:
    """The request's time budget in s; a zero deadline falls back to ``default_ms``."""
    budget = request.deadline.sec + request.deadline.nanosec * 1e-9
    if budget == 0:
        budget = default_ms * 1e-3
    return budget or None


class RetrievalNode(Node):
    """Serves ``~/retrieve`` from a vector DB held in this process's memory."""

    def __init__(self, node_name: str = "retrieval_node", *,
                 store_opener: StoreOpener = open_store, **kwargs) -> None:
        """Declare parameters, open the DB (or note why not) and start serving.

        Args:
            node_name: default node name (remappable with ``__node:=``).
            store_opener: ``open_store``-compatible factory (tests pass a fake backend).
            **kwargs: passed to :class:`rclpy.node.Node` (``context``,
                ``parameter_overrides``, ...).
        """
        super().__init__(node_name, **kwargs)
        self._open_store = store_opener
        self._store: VectorStore | None = None
        self._retriever: Retriever | None = None
        self._reason = ""  # why the DB is unavailable; "" when open
        self._counts: dict[str, int | str] = {}  # task -> points, or why counting failed
        self._stats_lock = threading.Lock()  # the service and diagnostics threads share these
        self._latencies_ms: deque[float] = deque(maxlen=200)
        self._status_counts: Counter[str] = Counter()
        self.store_config: StoreConfig | None = None
        self.config = RetrievalNodeConfig()
        self.retriever_config = RetrieverConfig()
        try:
            self.config = dataclass_from_parameters(self, RetrievalNodeConfig)
            self.retriever_config = dataclass_from_parameters(
                self, RetrieverConfig, "retriever", skip=_UNUSED_RETRIEVER_FIELDS)
            self.store_config = absolute_path(
                dataclass_from_parameters(self, StoreConfig, "store"))
        except ValueError as exc:
            self._reason = f"retrieval node not configured: {exc}"
            self.get_logger().error(self._reason)
        self._latencies_ms = deque(maxlen=self.config.latency_window)

        # The DB (open, search, close) is touched only from this group, one callback at a
        # time; diagnostics run in their own group so a slow search does not delay them.
        self._db_group = MutuallyExclusiveCallbackGroup()
        self._diag_group = MutuallyExclusiveCallbackGroup()
        self.create_service(Retrieve, "~/retrieve", self._on_retrieve,
                            callback_group=self._db_group)
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        if self.config.diagnostics_period_s > 0:
            self.create_timer(self.config.diagnostics_period_s, self._publish_diagnostics,
                              callback_group=self._diag_group)
        self._reopen_timer = None
        if self.store_config is not None:
            self._try_open()
            if self._store is None and self.config.reopen_period_s > 0:
                self._reopen_timer = self.create_timer(
                    self.config.reopen_period_s, self._try_open, callback_group=self._db_group)

    # ------------------------------------------------------------------ DB lifecycle
    @property
    def db_ready(self) -> bool:
        """Whether a DB is open and requests are searched."""
        return self._retriever is not None

    @property
    def unavailable_reason(self) -> str:
        """Why requests get STATUS_ERROR ("" when the DB is open)."""
        return self._reason

    def _try_open(self) -> None:
        """Open the DB; on failure keep the reason (logged when it changes) for requests."""
        if self._store is not None or self.store_config is None:
            return
        cfg = self.config
        try:
            store = self._open_store(self.store_config,
                                     dimension=cfg.expected_dimension or None,
                                     model_fingerprint=cfg.model_fingerprint or None)
        except (StoreError, ImportError, OSError, RuntimeError) as exc:
            # StoreError: missing DB, metadata mismatch, backend down. ImportError: backend
            # package not installed. OSError/RuntimeError: local-mode lock, file system.
            reason = f"retrieval DB unavailable: {exc}"
            if reason != self._reason:
                retry = (f"; retrying every {cfg.reopen_period_s:g} s"
                         if cfg.reopen_period_s > 0 else "")
                self.get_logger().error(reason + retry)
            self._reason = reason
            return
        counts: dict[str, int | str] = {}
        for task in store.list_collections():  # also loads every shard before the 1st request
            try:
                counts[task] = store.count(task)
            except StoreError as exc:
                counts[task] = f"count failed: {exc}"
        warm = getattr(store, "warm_up", None)
        if warm is not None:
            # Shards, payload caches and vectors in memory before the first request, so no
            # request pays for them under its deadline (cold HNSW searches take ~5-7 ms).
            try:
                warm()
            except StoreError as exc:
                self.get_logger().warning(f"retrieval DB warm-up failed: {exc}")
        self._store, self._counts, self._reason = store, counts, ""
        self._retriever = Retriever(store, self.retriever_config)
        if self._reopen_timer is not None:
            self._reopen_timer.cancel()
        self.get_logger().info(
            f"retrieval DB open at {describe_location(self.store_config)}: "
            f"{store.dimension}-d, model {store.manifest.model_fingerprint!r}, "
            f"{len(counts)} tasks, {sum(c for c in counts.values() if isinstance(c, int))} "
            f"points")

    def destroy_node(self) -> None:
        """Close the DB (flushes and releases the embedded DB's lock), then the node."""
        store, self._store, self._retriever = self._store, None, None
        if store is not None:
            try:
                store.close()
            except StoreError as exc:
                self.get_logger().warning(f"closing the retrieval DB failed: {exc}")
        super().destroy_node()

    # ------------------------------------------------------------------ serving
    def _on_retrieve(self, request: Retrieve.Request,
                     response: Retrieve.Response) -> Retrieve.Response:
        t0 = time.perf_counter()
        result = self._retrieve(request)
        response.status = int(result.status)  # RetrievalStatus numbers are the srv's
        response.reason = result.reason
        try:
            response.candidates = [candidate_to_msg(c) for c in result.candidates]
        except (ValueError, TypeError, AssertionError) as exc:  # rosidl setters assert ranges
            response.status, response.candidates = int(RetrievalStatus.ERROR), []
            response.reason = f"candidate of task {request.task!r} does not fit the message: {exc}"
        response.latency_ms = (time.perf_counter() - t0) * 1e3
        self._record(RetrievalStatus(response.status), response.reason, response.latency_ms)
        return response

    def _retrieve(self, request: Retrieve.Request) -> RetrievalResult:
        """Run the library on one request; every problem comes back as a status + reason."""
        retriever = self._retriever
        if retriever is None:
            return RetrievalResult(RetrievalStatus.ERROR, self._reason)
        embedding = np.asarray(request.embedding, dtype=np.float32)
        k = int(request.k) or self.retriever_config.k
        return retriever.retrieve(request.task, embedding, k=k,
                                  deadline_s=deadline_s(request, self.config.default_deadline_ms),
                                  demoted_ids=[int(i) for i in request.demoted_ids])

    def _record(self, status: RetrievalStatus, reason: str, latency_ms: float) -> None:
        with self._stats_lock:
            self._latencies_ms.append(latency_ms)
            self._status_counts[status.name] += 1
        # Throttled per call site: a client retrying a bad request must not flood the log.
        if status == RetrievalStatus.ERROR:
            self.get_logger().error(f"retrieve: ERROR: {reason}", throttle_duration_sec=5.0)
        elif status in (RetrievalStatus.EMPTY, RetrievalStatus.BAD_REQUEST):
            self.get_logger().warning(f"retrieve: {status.name}: {reason}",
                                      throttle_duration_sec=5.0)

    # ------------------------------------------------------------------ diagnostics
    def diagnostic_status(self) -> DiagnosticStatus:
        """DB state, per-task point counts (as of opening), request counts, latency p50/p99."""
        with self._stats_lock:
            latencies = np.array(self._latencies_ms, dtype=np.float64)
            status_counts = dict(self._status_counts)
        where = describe_location(self.store_config) if self.store_config else "unconfigured"
        store = self._store
        values = {"db_status": "open" if store is not None else "unavailable",
                  "location": where, "reason": self._reason}
        if store is not None:
            values.update(dimension=str(store.dimension),
                          model_fingerprint=store.manifest.model_fingerprint,
                          collections=str(len(self._counts)))
            values.update({f"count[{task}]": str(n) for task, n in self._counts.items()})
        values["requests_in_window"] = str(len(latencies))
        if len(latencies):
            p50, p99 = np.percentile(latencies, [50, 99])
            values.update(latency_p50_ms=f"{p50:.3f}", latency_p99_ms=f"{p99:.3f}")
        values.update({f"requests[{name}]": str(n) for name, n in sorted(status_counts.items())})
        if store is None:
            level, message = DiagnosticStatus.ERROR, self._reason
        elif not self._counts:
            level, message = DiagnosticStatus.WARN, "DB open but it holds no collections"
        else:
            level, message = DiagnosticStatus.OK, "DB open"
        return DiagnosticStatus(level=level, name=f"{self.get_name()}: retrieval DB",
                                message=message, hardware_id=where,
                                values=[KeyValue(key=k, value=v) for k, v in values.items()])

    def _publish_diagnostics(self) -> None:
        msg = DiagnosticArray(status=[self.diagnostic_status()])
        msg.header.stamp = self.get_clock().now().to_msg()
        self._diag_pub.publish(msg)


def main(args: list[str] | None = None) -> None:
    """Run the node until Ctrl-C, SIGTERM or ROS shutdown."""
    # Two threads: a slow search must not hold up diagnostics and timers.
    spin_node(RetrievalNode, args, num_threads=2)


if __name__ == "__main__":
    main()
