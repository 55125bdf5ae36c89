"""heisd-bringup when a node dies: every node stops, exit code 1, the reason on the last line.

The launch does the same through ``on_exit`` (test_launch_stop_rules.py). Here the real
sim node runs next to a node of this test that dies, in a real heisd-bringup process
(:func:`heisd_ros.tools.bringup.run` on a plan with the extra node): one whose callback
raises once the graph runs, and one whose constructor raises (the nodes after it are never
built).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from heisd_ros.testing.domains import reserved_domain
from test.ros_env import require_ros

require_ros()

REPO = Path(__file__).resolve().parents[1]
SCRIPT = '''
import sys
from rclpy.node import Node
from heisd_ros.nodes.graph import NodeSpec
from heisd_ros.tools import bringup

class CrashingNode(Node):
    """Runs, then one of its callbacks raises."""
    def __init__(self, name, **kwargs):
        super().__init__(name, **kwargs)
        self.create_timer(0.5, self.tick)
    def tick(self):
        raise RuntimeError("boom in a callback")

class FailingNode(Node):
    def __init__(self, name, **kwargs):
        raise ValueError("model.path: no such file")

class NeverNode(Node):
    def __init__(self, name, **kwargs):
        print("NEVER_NODE_BUILT", flush=True)
        super().__init__(name, **kwargs)

plan = [item for item in bringup.node_plan({}) if item["spec"].name == "sim_node"]
for name, cls in [arg.split(":") for arg in sys.argv[1:]]:
    plan.append({"spec": NodeSpec(name, name, "__main__", cls, "-"), "overrides": {},
                 "params_file": plan[0]["params_file"], "remappings": []})
bringup.run(plan, 2)
'''


def run_bringup(tmp_path, *extra: str) -> tuple[int, str]:
    """The script as a process on a DDS domain of its own; (exit code, its output)."""
    with reserved_domain() as domain:  # subprocess.run waits for (or kills) the script
        env = dict(os.environ, ROS_DOMAIN_ID=str(domain), PYTHONPATH=os.pathsep.join(
            [str(REPO)] + os.environ.get("PYTHONPATH", "").split(os.pathsep)))
        result = subprocess.run([sys.executable, "-c", SCRIPT, *extra], capture_output=True,
                                text=True, env=env, cwd=tmp_path, timeout=120)
    return result.returncode, result.stdout + result.stderr


def test_a_callback_that_raises_stops_every_node(tmp_path):
    code, text = run_bringup(tmp_path, "crashing_node:CrashingNode")
    assert "[sim_node]: episode 0:" in text, text  # the sim ran first
    assert code == 1, text
    assert text.rstrip().splitlines()[-1] == (
        "heisd-bringup: crashing_node died (RuntimeError: boom in a callback): stopping every "
        "node of the graph"), text
    assert "Traceback" in text and "in tick" in text  # for whoever debugs it


def test_a_node_that_fails_to_start_stops_the_others(tmp_path):
    code, text = run_bringup(tmp_path, "failing_node:FailingNode", "never_node:NeverNode")
    assert "[sim_node]: episode 0:" in text, text
    assert code == 1, text
    assert text.rstrip().splitlines()[-1] == (
        "heisd-bringup: failing_node failed to start (ValueError: model.path: no such file): "
        "stopping every node of the graph"), text
    assert "NEVER_NODE_BUILT" not in text


def test_failed_node_names_the_node_whose_method_raised():
    from heisd_ros.tools.bringup import failed_node

    class Named:
        def __init__(self, name):
            self.name = name

        def get_name(self):
            return self.name

        def callback(self):
            helper()

    def helper():
        raise RuntimeError("in a helper the node's callback called")

    nodes = [Named("a"), Named("b")]
    with pytest.raises(RuntimeError) as err:
        nodes[1].callback()
    assert failed_node(err.value, nodes) == "b"
    assert failed_node(RuntimeError("no traceback"), nodes) == "a node"
