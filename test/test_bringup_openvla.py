"""heisd-bringup with an OpenVLA checkpoint: the launch arguments, one process, real DDS.

The tiny random checkpoint in OpenVLA's real layout is named as a user names OpenVLA-7B
(``--model-type openvla --checkpoint DIR --unnorm-key KEY``), plus ``--vision-specs`` (the
tiny backbones' sizes). With ``--allow-cpu true`` the sim graph acts; without it, on the CPU,
the policy refuses at start with the reason and the graph stays up (nothing hangs loading).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from test.node_process import repo_env
from test.polling import spin_until, wait_until
from test.ros_env import require_ros

rclpy, hmsg, _ = require_ros()

from rclpy.executors import SingleThreadedExecutor  # noqa: E402

from test.openvla_fixtures import write_tiny_openvla, write_vision_specs  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def openvla_args(tmp_path_factory):
    root = tmp_path_factory.mktemp("openvla")
    checkpoint = write_tiny_openvla(root / "ckpt")
    specs = write_vision_specs(root / "vision_specs.json")
    return ["--model-type", "openvla", "--checkpoint", str(checkpoint), "--unnorm-key",
            "libero_spatial", "--vision-specs", str(specs)]


class Bringup:
    """heisd-bringup in a subprocess on its own DDS domain, and a listener in this one."""

    def __init__(self, argv: list[str], tmp: Path, domain: int) -> None:
        env = repo_env(ROS_DOMAIN_ID=str(domain))
        self.log = tmp / "bringup.log"
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "heisd_ros.tools.bringup",
                                          *argv], stdout=out, stderr=subprocess.STDOUT,
                                         env=env, cwd=tmp)
        self.context = rclpy.Context()
        rclpy.init(context=self.context, domain_id=domain)
        self.node = rclpy.create_node("bringup_openvla_listener", context=self.context)
        self.steps = []
        self.node.create_subscription(hmsg.HybridStep, "/heisd/hybrid_step", self.steps.append,
                                      10)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)

    def text(self) -> str:
        return self.log.read_text()

    def stop(self) -> int:
        """Ctrl-C; the exit code."""
        self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.executor.shutdown()
        self.node.destroy_node()
        rclpy.shutdown(context=self.context)
        return code


def test_bringup_runs_the_sim_graph_on_openvla(openvla_args, tmp_path, ros_domain):
    graph = Bringup([*openvla_args, "--allow-cpu", "true", "--method", "drafter", "--db",
                     str(tmp_path / "no_db")], tmp_path, ros_domain)
    try:
        spin_until(graph.executor, lambda: graph.steps or graph.proc.poll() is not None, 90)
        text = graph.text()
        assert graph.steps, text[-4000:]
        assert "policy configured: method 'drafter', target OpenVLA " in text
        step = graph.steps[0]
        assert step.target_forwards >= 1 and step.total_ms > 0
    finally:
        code = graph.stop()
    assert code == 0, graph.text()[-3000:]
    assert "Traceback" not in graph.text()


def test_bringup_without_the_opt_in_refuses_openvla_on_the_cpu(openvla_args, tmp_path,
                                                                ros_domain):
    graph = Bringup([*openvla_args, "--device", "cpu", "--db", str(tmp_path / "no_db")],
                    tmp_path, ros_domain)
    try:
        assert wait_until(lambda: "OpenVLA on the CPU refused" in graph.text()
                          or graph.proc.poll() is not None, 60), graph.text()[-3000:]
        text = graph.text()
        assert ("policy not configured: ValueError: OpenVLA on the CPU refused: device 'cpu' "
                "was asked for") in text
        assert "opt in with model.allow_cpu: true (launch argument allow_cpu:=true)" in text
        assert graph.proc.poll() is None  # the graph stays up, the policy says why
    finally:
        code = graph.stop()
    assert code == 0 and not graph.steps
