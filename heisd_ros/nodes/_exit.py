"""Leaving a node process (or the policy's decode worker) without the interpreter's finalisation.

Its own module, without rclpy, so that the decode worker of a method without retrieval does
not import rclpy only to exit.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import sys
from typing import NoReturn


def exit_process(code: int) -> NoReturn:
    """Flush every output and end the process now with ``code``, skipping finalisation.

    Why ``os._exit``: after the orderly teardown nothing is left to clean up, but CPython's
    finalisation still tears down every module and collects every object; with torch and
    transformers loaded that took most of the policy node's exit (1.2 s idle, up to ~4.6 s
    on a loaded machine), and ``ros2 launch`` escalates to SIGTERM after 5 s. What
    finalisation would have done that matters is done here first: the ``atexit`` functions
    (Python's ``logging`` flushes its handlers there; tests hook in there too), Python's and
    C's stdio buffers (rcutils logs through C stdio). Threads still running are not joined:
    whatever a node must finish (close CAN, the renderer, the DB) belongs in its
    ``destroy_node``, which :func:`~heisd_ros.nodes._spin.tear_down` has run (the decode
    worker: its retrieval context). Only call this after the rclpy context is shut down
    (rcl's log file is flushed then).
    """
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):  # closed, replaced or gone
            pass
    ctypes.CDLL(None).fflush(None)  # every C stdio stream (rcutils console output)
    os._exit(code)
