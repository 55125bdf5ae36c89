"""How every heisd_ros node process runs: one node on a multi-threaded executor until a signal."""

from __future__ import annotations

import signal
from collections.abc import Callable

import rclpy
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor
from rclpy.node import Node
from rclpy.signals import SignalHandlerOptions


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def spin_node(make_node: Callable[[], Node], args: list[str] | None = None,
              num_threads: int = 2) -> None:
    """Create the node with ``make_node`` and spin it until Ctrl-C, SIGTERM or ROS shutdown.

    SIGINT/SIGTERM raise KeyboardInterrupt in this thread instead of rclpy's handler shutting
    the context down under the running executor: with fast timers the executor rebuilds its
    wait set constantly and that races ("context is not valid" at exit). This way the callbacks
    finish first, then the node is destroyed (a driver keeps its arm holding), then the context.
    The handlers are set explicitly because a background process may inherit SIGINT as ignored.

    Args:
        make_node: builds the node (called after ``rclpy.init``).
        args: command-line arguments for rclpy (remappings, ``--ros-args``).
        num_threads: executor threads, so a slow callback does not hold up timers.
    """
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        with rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO):
            node = make_node()
            executor = MultiThreadedExecutor(num_threads=num_threads)
            executor.add_node(node)
            try:
                executor.spin()
            finally:
                executor.shutdown()
                node.destroy_node()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
