"""Second process for the DDS round-trip test: echoes heisd_ros messages and serves Retrieve.

Run as ``python dds_peer.py DOMAIN_ID``. For each custom message type T it subscribes to
``/heisd_test/T`` and republishes what it got on ``/heisd_test/T_echo``. Its Retrieve service
answers with one candidate per requested k, built from the request's fields, so the caller can
check that every request field arrived intact; SetInstruction echoes the instruction back.
"""

from __future__ import annotations

import sys

import rclpy
from heisd_ros.msg import EECommand, EpisodeStatus, HybridStep, RetrievalCandidate
from heisd_ros.srv import Retrieve, SetInstruction
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

MSG_TYPES = (EECommand, EpisodeStatus, HybridStep, RetrievalCandidate)
# Reliable + transient local: a reader matched a moment after the writer still gets the
# history, so discovery finishing on one side before the other loses no message.
QOS = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE,
                 durability=DurabilityPolicy.TRANSIENT_LOCAL)


class EchoPeer(Node):
    """Echo every custom message and answer both services from the request's content."""

    def __init__(self, context) -> None:
        super().__init__("heisd_dds_peer", context=context)
        self._keep = []
        for msg_type in MSG_TYPES:
            topic = f"/heisd_test/{msg_type.__name__}"
            pub = self.create_publisher(msg_type, topic + "_echo", QOS)
            self._keep.append(pub)
            self._keep.append(self.create_subscription(msg_type, topic, pub.publish, QOS))
        self.create_service(Retrieve, "/heisd_test/retrieve", self._retrieve)
        self.create_service(SetInstruction, "/heisd_test/set_instruction", self._set_instruction)

    def _retrieve(self, request, response):
        ok = request.k > 0
        response.status = Retrieve.Response.STATUS_OK if ok else Retrieve.Response.STATUS_EMPTY
        response.reason = "" if request.k else f"k=0 for task {request.task!r}"
        for i in range(request.k):
            cand = RetrievalCandidate()
            ids, emb = request.demoted_ids, request.embedding
            cand.id = ids[i % len(ids)] if len(ids) else i
            cand.score = emb[i % len(emb)] if len(emb) else 0.0
            cand.task = request.task
            cand.episode = request.deadline.sec
            cand.step = request.deadline.nanosec
            cand.lookahead_actions = list(request.embedding)
            response.candidates.append(cand)
        response.latency_ms = float(len(request.embedding))
        return response

    def _set_instruction(self, request, response):
        response.success = True
        response.message = f"{request.instruction}|{request.task}"
        return response


def main() -> None:
    """Spin the peer until killed."""
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=int(sys.argv[1]))
    node = EchoPeer(context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    print("ready", flush=True)
    try:
        executor.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass


if __name__ == "__main__":
    main()
