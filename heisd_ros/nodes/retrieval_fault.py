r"""A stand-in for the retrieval node that answers late or with nothing: for fault drills.

This is a diagnostic tool for fault drills, not a retrieval service: it opens no DB and never
returns a candidate. It serves ``heisd_ros/srv/Retrieve`` under the retrieval node's name
(node ``retrieval_node``, service ``~/retrieve`` = ``/retrieval_node/retrieve``, as
``heisd_ros/nodes/retrieval_node.py``), so a policy node started beside it calls it as it
would call the real node and must fall back to its draft head (``heisd-bench graph
--retrieval-fault slow|empty`` starts it in place of the retrieval node).

Modes:
    ``slow``: every request is answered after ``--delay-s`` (status OK, no candidates, reason
        "fault injection: answered after X s"). Each request blocks one executor thread, and
        the threads run side by side, so several requests can be pending at once (up to
        ``--threads``; more wait for a free thread and are answered later still).
    ``empty``: every request is answered at once with status OK and no candidates.

Usage (after ``source .heisd-env.sh``)::

    python -m heisd_ros.nodes.retrieval_fault --mode slow --delay-s 0.5
    python -m heisd_ros.nodes.retrieval_fault --mode empty --ros-args -r __ns:=/drill

SIGINT or SIGTERM stops it cleanly (``heisd_ros.nodes._spin.spin_node``); a request still
waiting out its delay is answered before the process exits.
"""

from __future__ import annotations

import argparse
import math
import sys
import threading
import time
from collections.abc import Sequence

from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.node import Node

from heisd_ros.srv import Retrieve

MODES = ("slow", "empty")
NODE_NAME = "retrieval_node"  # the retrieval node's, so the policy's client finds this one


class RetrievalFaultNode(Node):
    """Serves ``~/retrieve`` with no candidates, at once (``empty``) or late (``slow``)."""

    def __init__(self, mode: str, delay_s: float = 0.5, node_name: str = NODE_NAME,
                 **kwargs) -> None:
        """Create the service.

        Args:
            mode: ``slow`` or ``empty``.
            delay_s: how long ``slow`` holds each answer, s (>= 0).
            node_name: node name (the retrieval node's by default).
            **kwargs: passed to :class:`rclpy.node.Node` (``context``, ...).
        """
        if mode not in MODES:
            raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
        if not (math.isfinite(delay_s) and delay_s >= 0):
            raise ValueError(f"delay_s: expected a finite value >= 0, got {delay_s}")
        super().__init__(node_name, **kwargs)
        self.mode, self.delay_s = mode, float(delay_s)
        self._lock = threading.Lock()
        self.requests = 0
        self.create_service(Retrieve, "~/retrieve", self._on_retrieve,
                            callback_group=ReentrantCallbackGroup())
        what = (f"answering every request after {self.delay_s:g} s" if mode == "slow"
                else "answering every request at once")
        self.get_logger().warning(f"fault injection ({mode}): {what}, status OK, no "
                                  f"candidates. A drill tool, not a retrieval service")

    def _on_retrieve(self, request: Retrieve.Request,
                     response: Retrieve.Response) -> Retrieve.Response:
        t0 = time.monotonic()
        with self._lock:
            self.requests += 1
        if self.mode == "slow":
            left_s = self.delay_s - (time.monotonic() - t0)
            if left_s > 0:
                time.sleep(left_s)  # the fault itself: this thread holds the answer back
            elapsed_s = time.monotonic() - t0
            response.reason = f"fault injection: answered after {elapsed_s:.3f} s"
        else:
            response.reason = "fault injection: no candidates"
        response.status = Retrieve.Response.STATUS_OK
        response.candidates = []
        response.latency_ms = (time.monotonic() - t0) * 1e3
        return response

    def destroy_node(self) -> None:
        """Log how many requests were answered, then destroy the node."""
        self.get_logger().info(f"fault injection ({self.mode}): {self.requests} requests "
                               f"answered")
        super().destroy_node()


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The program's own options from ``argv`` (no program name; ``--ros-args ...`` ignored)."""
    from rclpy.utilities import remove_ros_args

    parser = argparse.ArgumentParser(prog="python -m heisd_ros.nodes.retrieval_fault",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--delay-s", type=float, default=0.5,
                        help="slow: hold each answer this long, s")
    parser.add_argument("--threads", type=int, default=8,
                        help="executor threads: requests pending at once in slow mode")
    args = parser.parse_args(remove_ros_args(["retrieval_fault", *argv])[1:])
    if not (math.isfinite(args.delay_s) and args.delay_s >= 0):
        parser.error(f"--delay-s: expected a value >= 0, got {args.delay_s}")
    if args.threads < 1:
        parser.error(f"--threads: expected >= 1, got {args.threads}")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    """Serve until SIGINT, SIGTERM or ROS shutdown (``argv``: without the program name)."""
    from heisd_ros.nodes._spin import spin_node

    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    spin_node(lambda: RetrievalFaultNode(args.mode, args.delay_s), [sys.argv[0], *argv],
              num_threads=args.threads)


if __name__ == "__main__":
    main()
