"""Run a heisd_ros node program in its own process for real-DDS node tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def repo_env(**extra: str) -> dict[str, str]:
    """This process's environment for a child Python that imports heisd_ros from this checkout.

    The repository goes first on PYTHONPATH; ``extra`` sets further variables (e.g.
    ``ROS_DOMAIN_ID``).
    """
    return dict(os.environ, **extra, PYTHONPATH=os.pathsep.join(
        [str(REPO)] + os.environ.get("PYTHONPATH", "").split(os.pathsep)))


def write_params(path: Path, node_name: str, overrides: dict, strict: bool = True) -> Path:
    """The shipped ``config/<node_name>.yaml`` with ``overrides``, written to ``path``.

    See :func:`heisd_ros.nodes.graph.write_params_file` (a missing parameter fails the test).
    """
    from heisd_ros.nodes.graph import write_params_file

    return write_params_file(path, node_name, overrides, strict)


class NodeProcess:
    """A node program in a subprocess on DDS domain ``domain``; its output goes to a log."""

    def __init__(self, argv: list[str], tmp: Path, domain: int) -> None:
        self.log = tmp / "node.log"
        env = repo_env(ROS_DOMAIN_ID=str(domain))
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen([sys.executable, *argv], stdout=log,
                                         stderr=subprocess.STDOUT, env=env, cwd=tmp)

    def text(self) -> str:
        """Everything the node printed so far."""
        return self.log.read_text()

    def stop(self) -> int:
        """Ctrl-C the node (a clean shutdown) and return its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
