"""The retrieval node as a retrieval client: ``retrieve(...)`` over the Retrieve service.

The hybrid decoder's retrieval source calls :meth:`RetrievalServiceClient.retrieve` from the
policy node's step callback. The call never blocks past its deadline: the request goes out
with ``call_async`` and the caller waits on the future for the deadline plus a transport
margin; a late answer is dropped (``remove_pending_request``). Without a service (node not
started, killed, restarting) the call returns ERROR at once, and the decoder drafts with the
draft head instead (AR for a method without one); as soon as the service is back the next
call uses it again. A killed node is noticed by DDS only after its lease expires: until then
each call waits out its deadline.

A service that stops answering in time (overloaded, hung, or killed before DDS noticed) would
cost every step its whole deadline before the fallback decodes. After ``backoff_after`` missed
deadlines in a row the client does not ask for ``backoff_s`` (each step falls back at once,
DEADLINE_EXCEEDED, the reason says so), then asks again; one answer ends the back-off.

The service's future is completed by the executor, so the client must sit in a callback
group that runs beside the step callback (a multi-threaded executor).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

import numpy as np
from rclpy.node import Node

from heisd_ros.msg import RetrievalCandidate
from heisd_ros.retrieval.errors import RetrievalStatus
from heisd_ros.retrieval.records import Candidate, StepRecord
from heisd_ros.retrieval.retriever import RetrievalResult
from heisd_ros.srv import Retrieve

DEFAULT_SERVICE = "/retrieval_node/retrieve"


def candidate_from_msg(msg: RetrievalCandidate) -> Candidate:
    """The library candidate of one message (lookahead unflattened to (n, 7))."""
    bins = np.asarray(msg.lookahead_bins, dtype=np.int64).reshape(-1, 7)
    actions = np.asarray(msg.lookahead_actions, dtype=np.float64).reshape(-1, 7)
    record = StepRecord(task=msg.task, episode=msg.episode, step=msg.step,
                        bins=np.asarray(msg.bins, dtype=np.int64),
                        action=np.asarray(msg.action, dtype=np.float64),
                        lookahead_bins=bins, lookahead_actions=actions,
                        ee_position_m=np.array([msg.ee_position_m.x, msg.ee_position_m.y,
                                                msg.ee_position_m.z]))
    return Candidate(id=int(msg.id), score=float(msg.score), record=record)


class RetrievalServiceClient:
    """``retrieve(task, embedding, k, deadline_s, demoted_ids)`` backed by the service."""

    def __init__(self, node: Node, service: str = DEFAULT_SERVICE, *, callback_group=None,
                 transport_margin_s: float = 0.02, no_deadline_timeout_s: float = 1.0,
                 backoff_after: int = 3, backoff_s: float = 1.0) -> None:
        """Create the service client.

        Args:
            node: the node that owns the client.
            service: the Retrieve service name.
            callback_group: group of the client (must run beside the caller's callback).
            transport_margin_s: added to the deadline for the round trip, s.
            no_deadline_timeout_s: wait limit of a request without a deadline, s.
            backoff_after: missed deadlines in a row before the client stops asking for a
                while (0 = never).
            backoff_s: how long it does not ask then, s.
        """
        self.node = node
        self.service = service
        self.client = node.create_client(Retrieve, service, callback_group=callback_group)
        self.transport_margin_s = transport_margin_s
        self.no_deadline_timeout_s = no_deadline_timeout_s
        self.available = None  # last known availability (None = unknown), for the log
        self.calls = self.failures = 0
        self.requests_sent = 0  # calls that reached the service (not answered at once here)
        self.backoff_after, self.backoff_s = backoff_after, backoff_s
        self._missed = 0  # deadlines missed in a row
        self._quiet_until = -float("inf")  # monotonic time until which nothing is asked

    def retrieve(self, task: str, embedding: np.ndarray, *, k: int | None = None,
                 deadline_s: float | None = None,
                 demoted_ids: Iterable[int] = ()) -> RetrievalResult:
        """Top-k candidates, or a non-OK status with the reason.

        Never raises and never blocks longer than ``deadline_s`` + the transport margin.
        """
        t0 = time.perf_counter()
        self.calls += 1
        if not self.client.service_is_ready():
            return self._failed(RetrievalStatus.ERROR, f"retrieval service {self.service} not "
                                                       f"available", t0)
        quiet_s = self._quiet_until - time.monotonic()
        if quiet_s > 0:
            return self._failed(RetrievalStatus.DEADLINE_EXCEEDED,
                                f"{self.service} missed {self._missed} deadlines in a row: not "
                                f"asked for another {quiet_s:.1f} s", t0)
        self.requests_sent += 1
        request = Retrieve.Request(task=task, k=int(k or 0),
                                   demoted_ids=[int(i) for i in demoted_ids])
        request.embedding = np.asarray(embedding, dtype=np.float32).reshape(-1).tolist()
        if deadline_s:
            request.deadline.sec, request.deadline.nanosec = divmod(int(deadline_s * 1e9), 10**9)
        wait_s = (deadline_s + self.transport_margin_s) if deadline_s \
            else self.no_deadline_timeout_s
        answered = threading.Event()
        future = self.client.call_async(request)
        future.add_done_callback(lambda _f: answered.set())
        if not answered.wait(wait_s):
            self.client.remove_pending_request(future)
            self._missed += 1
            if self.backoff_after and self._missed >= self.backoff_after:
                self._quiet_until = time.monotonic() + self.backoff_s
            return self._failed(RetrievalStatus.DEADLINE_EXCEEDED,
                                f"no answer from {self.service} within {wait_s * 1e3:.1f} ms", t0)
        self._missed = 0
        response = future.result()
        if response is None:
            return self._failed(RetrievalStatus.ERROR, f"{self.service}: call failed", t0)
        self._mark(True)
        try:
            candidates = tuple(candidate_from_msg(c) for c in response.candidates)
        except ValueError as exc:
            return self._failed(RetrievalStatus.ERROR, f"malformed candidate: {exc}", t0)
        return RetrievalResult(RetrievalStatus(response.status), response.reason, candidates,
                               (time.perf_counter() - t0) * 1e3)

    def _failed(self, status: RetrievalStatus, reason: str, t0: float) -> RetrievalResult:
        self.failures += 1
        if status == RetrievalStatus.ERROR:
            self._mark(False, reason)
        return RetrievalResult(status, reason, (), (time.perf_counter() - t0) * 1e3)

    def _mark(self, available: bool, reason: str = "") -> None:
        """Log the transitions: lost (drafter mode) and back (retrieval again)."""
        if available == self.available:
            return
        if available:
            self.node.get_logger().info(f"retrieval service {self.service} available")
        elif self.available is not None or reason:
            self.node.get_logger().warning(f"{reason}: decoding without retrieval drafts "
                                           f"(drafter, or AR without a draft head) until it "
                                           f"is back")
        self.available = available
