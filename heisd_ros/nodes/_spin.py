"""How every heisd_ros node process runs and stops: spin until a signal, tear down, leave.

SIGINT and SIGTERM only set a flag (:class:`StopRequest`). A Python signal handler runs in the
main thread between two bytecodes of whatever it is doing: raising ``KeyboardInterrupt`` from
it (the earlier design) could land inside the executor's bookkeeping, ``executor.shutdown()``
or ``node.destroy_node()`` and print a traceback, and rclpy's own handler shuts the context
down under the running executor ("context is not valid" at exit with fast timers). With a
flag, the main thread spins with :meth:`Executor.spin_once` and a short timeout (a signal
cannot wake a DDS wait, so the flag is looked at every :data:`POLL_S`), then tears down in
order: the executor waits for running callbacks, the nodes are destroyed (the PIPER driver
closes CAN with the arm holding), the context shuts down (rcl logging is flushed). A second
Ctrl-C (``ros2 launch`` forwards SIGINT and the terminal sends one too) or a SIGTERM during
teardown finds the flag set and changes nothing. Then :func:`exit_process` leaves without
the interpreter's own finalisation; its docstring says why.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence
from typing import NoReturn

import rclpy
from rclpy.executors import Executor, MultiThreadedExecutor, SingleThreadedExecutor
from rclpy.node import Node
from rclpy.signals import SignalHandlerOptions

from heisd_ros.nodes._exit import exit_process

#: Longest wait of the spin loop, s: the latency from a signal to the start of the teardown.
POLL_S = 0.1


class StopRequest:
    """The signal handler for SIGINT and SIGTERM: it records the first signal, nothing else.

    It takes no lock and raises nothing, so it is safe in any frame it interrupts; a later
    signal is ignored (the teardown is already under way).
    """

    def __init__(self) -> None:
        self.signum = 0  # the first signal received; 0 = keep running

    def __call__(self, signum: int, _frame: object) -> None:
        if not self.signum:
            self.signum = signum

    def install(self) -> StopRequest:
        """Handle SIGINT and SIGTERM with this object (main thread only).

        Set explicitly because a background process may inherit SIGINT as ignored.
        """
        signal.signal(signal.SIGINT, self)
        signal.signal(signal.SIGTERM, self)
        return self


def spin_until_stopped(executor: Executor, stop: StopRequest, poll_s: float = POLL_S) -> None:
    """Run the executor's callbacks until ``stop`` has a signal or the context shut down.

    An exception raised by a callback propagates (the multi-threaded executor re-raises it
    here), as it did from ``executor.spin()``.
    """
    context = executor.context
    while not stop.signum and context.ok():
        executor.spin_once(timeout_sec=poll_s)


def tear_down(executor: Executor, nodes: Sequence[Node]) -> None:
    """Let running callbacks finish and stop the executor's threads, then destroy the nodes.

    Nodes are destroyed in reverse order of creation.
    """
    executor.shutdown()
    for node in reversed(nodes):
        node.destroy_node()


def spin_node(make_node: Callable[[], Node], args: list[str] | None = None,
              num_threads: int = 2) -> NoReturn:
    """Create the node with ``make_node``, spin it until a signal or ROS shutdown, then exit.

    Exits the process with 0 after a signal or a ROS shutdown; an exception from the node's
    constructor or a callback propagates (traceback, exit code 1) after the same teardown.
    A signal during the constructor (e.g. while the policy loads its models) is acted on
    once the node is built: aborting a half-built node could leave a CAN bus or a renderer
    open.

    Args:
        make_node: builds the node (called after ``rclpy.init``).
        args: command-line arguments for rclpy (remappings, ``--ros-args``).
        num_threads: executor threads, so a slow callback does not hold up timers; 1 = a
            single-threaded executor (no thread pool to feed: the least work per callback).
    """
    stop = StopRequest().install()
    with rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO):
        node = make_node()
        executor = (SingleThreadedExecutor() if num_threads == 1
                    else MultiThreadedExecutor(num_threads=num_threads))
        executor.add_node(node)
        try:
            spin_until_stopped(executor, stop)
            if stop.signum:
                node.get_logger().info(f"{signal.Signals(stop.signum).name}: shutting down")
        finally:
            tear_down(executor, [node])
    exit_process(0)
