"""robot_state_publisher in the launch: started with the URDF when installed, else one line.

The launch file runs against the stand-ins of test_bringup.py; the package look-up is the real
one (ament_index over ``AMENT_PREFIX_PATH``) or an injected one.
"""

from __future__ import annotations

import types
from pathlib import Path

from heisd_ros.nodes import graph
from heisd_ros.nodes import robot_description as rd
from heisd_ros.robot.piper_urdf import piper_urdf
from heisd_ros.tools import bringup
from test.test_bringup import ARGS, _fake_launch, _load_launch_module

REPO = Path(__file__).resolve().parents[1]
RSP = "robot_state_publisher"


def _fake_install(prefix: Path, package: str) -> Path:
    """An ament prefix with ``package`` and its executable of the same name; returns it."""
    index = prefix / "share" / "ament_index" / "resource_index" / "packages"
    index.mkdir(parents=True)
    (index / package).write_text("")
    executable = prefix / "lib" / package / package
    executable.parent.mkdir(parents=True)
    executable.write_text("#!/bin/sh\n")
    executable.chmod(0o755)
    return prefix


def _launch(monkeypatch, ament_prefix: Path, **values):
    """(actions the launch's OpaqueFunction returns, Node calls) with only ``ament_prefix``."""
    monkeypatch.setenv("AMENT_PREFIX_PATH", str(ament_prefix))
    monkeypatch.setenv("ROS_DISTRO", "jazzy")
    launched = _fake_launch(monkeypatch, {**ARGS, "rviz": "false", **values})
    description = _load_launch_module().generate_launch_description()
    return description[-1].kwargs["function"](None), launched


def _logged(actions) -> list[str]:
    """The messages of the LogInfo actions among ``actions``."""
    return [a.kwargs["msg"] for a in actions if "msg" in getattr(a, "kwargs", {})]


def test_launch_starts_robot_state_publisher_when_installed(monkeypatch, tmp_path):
    actions, launched = _launch(monkeypatch, _fake_install(tmp_path, RSP))
    assert [n["name"] for n in launched] == ["policy_node", "retrieval_node", "sim_node", RSP]
    rsp = launched[-1]
    assert (rsp["package"], rsp["executable"]) == (RSP, RSP)
    # heisd_ros is not in this ament index: the URDF is generated, the same text as installed
    assert rsp["parameters"] == [{"robot_description": piper_urdf()}]
    assert rsp["parameters"][0]["robot_description"] == (REPO / "urdf" / "piper.urdf").read_text()
    assert rsp["remappings"] == [("joint_states", "/joint_states")]
    assert _logged(actions) == []
    # optional, like rviz2: its end leaves the graph running
    running = types.SimpleNamespace(is_shutdown=False)
    assert rsp["on_exit"](types.SimpleNamespace(returncode=1), running) is None
    assert not graph.is_required(RSP) and graph.stop_reason(RSP, "exited") == ""


def test_launch_without_robot_state_publisher_logs_one_line(monkeypatch, tmp_path):
    actions, launched = _launch(monkeypatch, tmp_path / "empty_prefix", sim="false")
    assert [n["name"] for n in launched] == ["policy_node", "retrieval_node",
                                             "piper_driver_node"]
    logged = _logged(actions)
    assert len(logged) == 1
    assert "robot_state_publisher is not installed" in logged[0]
    assert "apt install ros-jazzy-robot-state-publisher" in logged[0]
    assert "\n" not in logged[0]


def test_viewer_nodes_with_an_injected_look_up(tmp_path):
    def not_installed(name):
        raise LookupError(name)

    nodes, line = rd.viewer_nodes(find_prefix=not_installed, distro="humble")
    assert nodes == ()
    assert "apt install ros-humble-robot-state-publisher" in line
    # a prefix without the executable is not an install either
    nodes, line = rd.viewer_nodes(find_prefix=lambda name: str(tmp_path), distro="humble")
    assert nodes == () and line
    prefix = _fake_install(tmp_path / "prefix", RSP)
    share = tmp_path / "share"
    (share / "urdf").mkdir(parents=True)
    (share / "urdf" / "piper.urdf").write_text("<robot name='installed'/>")
    nodes, line = rd.viewer_nodes(find_prefix=lambda name: str(prefix), share_dir=share)
    assert line == ""
    assert nodes == (rd.ExternalNode(RSP, RSP, RSP,
                                     parameters={"robot_description": "<robot name='installed'/>"},
                                     remappings=(("joint_states", "/joint_states"),)),)


def test_robot_description_falls_back_to_the_generated_urdf(tmp_path):
    assert rd.robot_description(share_dir=tmp_path) == piper_urdf()


def test_bringup_says_it_skips_robot_state_publisher(monkeypatch, capsys):
    started = []
    monkeypatch.setattr(bringup, "run", lambda plan, threads, *settings: started.append(plan))
    monkeypatch.setenv("ROS_DISTRO", "jazzy")
    bringup.main([])
    lines = capsys.readouterr().err.splitlines()
    assert len(started) == 1
    assert lines == ["heisd-bringup: robot_state_publisher is not started by heisd-bringup, so "
                     "rviz2 shows no arm model; use ros2 launch heisd_ros piper_heisd.launch.py "
                     "with it installed (apt install ros-jazzy-robot-state-publisher)"]
