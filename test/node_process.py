"""Run a heisd_ros node program in its own process for real-DDS node tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def write_params(path: Path, node_name: str, overrides: dict, strict: bool = True) -> Path:
    """Write the shipped ``config/<node_name>.yaml`` with ``overrides`` applied to ``path``.

    Keys like ``"safety.max_step_m"`` address nested parameters. With ``strict`` an override
    of a parameter the shipped YAML lacks is an error (the YAML must list every parameter).
    The file applies to ``/**`` so it holds whatever the node is renamed to.
    """
    shipped = yaml.safe_load((REPO / "config" / f"{node_name}.yaml").read_text())
    merged = shipped[node_name]["ros__parameters"]
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node = merged
        for part in parents:
            node = node[part]
        assert not strict or leaf in node, f"{key} is not in the shipped YAML"
        node[leaf] = value
    path.write_text(yaml.safe_dump({"/**": {"ros__parameters": merged}}))
    return path


class NodeProcess:
    """A node program in a subprocess on DDS domain ``domain``; its output goes to a log."""

    def __init__(self, argv: list[str], tmp: Path, domain: int) -> None:
        self.log = tmp / "node.log"
        env = dict(os.environ, ROS_DOMAIN_ID=str(domain), PYTHONPATH=os.pathsep.join(
            [str(REPO)] + os.environ.get("PYTHONPATH", "").split(os.pathsep)))
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
