"""The graph's node processes: started with their logs, supervised, stopped in order.

Each node runs as ``python -m <module> --ros-args ...`` in its own session, its output in
``<dir>/<name>.log``, on the private DDS domain of the run (:func:`dds_domain_id`; the id
travels to the children through ``ROS_DOMAIN_ID`` in :func:`graph_env`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import yaml

from heisd_ros.tools._common import sigterm_as_interrupt

#: Log format forced on the children, so their lines parse with their time (s since epoch).
LOG_FORMAT = "[{severity}] [{time}] [{name}]: {message}"
#: Stop order by the name's first word: the policy first, whatever it commands last.
STOP_ORDER = ("policy", "retrieval", "driver", "sim")


def dds_domain_id() -> int:
    """The private DDS domain of one run, held until this process ends.

    From ``heisd_ros.testing.domains``: a lock per id shared by every allocator on the
    machine, the tests included.
    """
    from heisd_ros.testing.domains import allocate_domain

    return allocate_domain()


def graph_env(domain: int) -> dict[str, str]:
    """The children's environment: this one on ``domain``, logs timed and unbuffered."""
    return {**os.environ, "ROS_DOMAIN_ID": str(domain),
            "RCUTILS_CONSOLE_OUTPUT_FORMAT": LOG_FORMAT, "PYTHONUNBUFFERED": "1"}


def ros_parameters(path: Path) -> dict:
    """The parameters of a params file written by ``graph.write_params_file``."""
    return yaml.safe_load(Path(path).read_text())["/**"]["ros__parameters"]


def tail_of(path: str | Path, lines: int = 20) -> str:
    """The last ``lines`` of a log file ("" when it cannot be read)."""
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@contextlib.contextmanager
def private_context(domain: int) -> Iterator[object]:
    """An rclpy context on ``domain`` without rclpy's signal handlers; SIGTERM = Ctrl-C.

    The run's own ``KeyboardInterrupt`` handling then stops the children on either signal.
    """
    import rclpy
    from rclpy.signals import SignalHandlerOptions

    with sigterm_as_interrupt():
        context = rclpy.Context()
        rclpy.init(context=context, domain_id=domain,
                   signal_handler_options=SignalHandlerOptions.NO)
        try:
            yield context
        finally:
            rclpy.shutdown(context=context)


class NodeProcesses:
    """The graph's processes: started with logs, stopped in order, their deaths named.

    Attributes:
        tmp: directory of the logs of the processes started next (a phase may move it).
        procs: running (or exited, not yet stopped) processes by name.
        logs: every started process's log file by name.
    """

    def __init__(self, tmp: Path, env: dict) -> None:
        self.tmp, self.env = tmp, env
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}

    def start(self, name: str, module: str, params: Path | None, extra: Sequence[str] = (),
              program_args: Sequence[str] = ()) -> None:
        """Start ``python -m module [program_args]`` with ``params`` (ROS arguments).

        Output goes to ``<tmp>/<name>.log``.
        """
        self.logs[name] = self.tmp / f"{name}.log"
        ros_args = ["--params-file", str(params)] if params is not None else []
        with open(self.logs[name], "w") as log:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", module, *program_args, "--ros-args", *ros_args,
                 *extra], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.env, cwd=self.tmp, start_new_session=True)

    def kill(self, name: str) -> str:
        """SIGKILL one child on purpose (no longer watched or stopped); what happened."""
        from heisd_ros.nodes.graph import exit_description

        proc = self.procs.pop(name)
        if proc.poll() is not None:
            return f"{name} had already {exit_description(proc.returncode)}"
        proc.kill()
        proc.wait()
        return f"{name} (pid {proc.pid}) SIGKILLed: {exit_description(proc.returncode)}"

    def dead(self) -> list[str]:
        """Children that exited, as "name exited with code N"."""
        from heisd_ros.nodes.graph import exit_description

        return [f"{name} {exit_description(p.returncode)}" for name, p in self.procs.items()
                if p.poll() is not None]

    def died(self) -> str:
        """:meth:`dead` in one line ("" while all run)."""
        return "; ".join(self.dead())

    def tail(self, name: str, lines: int = 20) -> str:
        """The last ``lines`` of a child's log."""
        return tail_of(self.logs[name], lines) if name in self.logs else ""

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGINT to each (policy first, the driver or sim last), then SIGKILL after a timeout."""
        for name in sorted(self.procs, key=lambda n: STOP_ORDER.index(n.split("_")[0])):
            proc = self.procs.pop(name)
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
