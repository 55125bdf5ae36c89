"""When the launch refuses to start, and when it stops every node (graph.py's rules).

``rviz:=true`` without rviz2 installed used to start the nodes and then fail on rviz2,
leaving them running with no Ctrl-C to reach them. Now the launch refuses before the first
node, saying how to install rviz2, and every required node carries an ``on_exit`` that shuts
the launch down. The launch file runs against the stand-ins of test_bringup.py; the rviz2
look-up is the real one (ament_index over ``AMENT_PREFIX_PATH``).
"""

from __future__ import annotations

import types

import pytest

from heisd_ros.nodes import graph
from test.test_bringup import ARGS, _fake_launch, _load_launch_module, fake_rviz_install


def _run_launch(monkeypatch, **values):
    """The node actions the launch file creates for ``values`` (on top of ARGS)."""
    launched = _fake_launch(monkeypatch, {**ARGS, **values})
    description = _load_launch_module().generate_launch_description()
    description[-1].kwargs["function"](None)
    return launched


def _no_rviz(monkeypatch, tmp_path, distro="jazzy"):
    """An ament index without rviz2 (whatever this machine has)."""
    monkeypatch.setenv("AMENT_PREFIX_PATH", str(tmp_path / "empty_prefix"))
    monkeypatch.setenv("ROS_DISTRO", distro)


@pytest.mark.parametrize("sim", ["true", "false"])
def test_rviz_without_rviz2_starts_no_node(monkeypatch, tmp_path, sim):
    _no_rviz(monkeypatch, tmp_path)
    launched = _fake_launch(monkeypatch, {**ARGS, "sim": sim, "rviz": "true"})
    description = _load_launch_module().generate_launch_description()
    with pytest.raises(RuntimeError) as err:
        description[-1].kwargs["function"](None)
    assert launched == []  # not the driver, not anything
    message = str(err.value)
    assert "rviz2 is not installed" in message
    assert "sudo apt-get install ros-jazzy-rviz2" in message
    assert "rviz:=false" in message and "no node was started" in message


def test_rviz_false_needs_no_rviz2(monkeypatch, tmp_path):
    _no_rviz(monkeypatch, tmp_path)
    launched = _run_launch(monkeypatch, rviz="false")
    assert [n["name"] for n in launched] == ["policy_node", "retrieval_node", "sim_node"]


def test_rviz_problem_names_what_is_missing(tmp_path, monkeypatch):
    def not_installed(name):
        raise LookupError(name)

    monkeypatch.delenv("ROS_DISTRO", raising=False)
    missing = graph.rviz_problem(find_prefix=not_installed)
    assert "$ROS_DISTRO" not in missing and "apt-get install ros-" in missing
    # the package is registered, but its executable is not there
    broken = graph.rviz_problem(find_prefix=lambda name: str(tmp_path), distro="kilted")
    assert f"{tmp_path}/lib/rviz2/rviz2 is not an executable file" in broken
    assert "ros-kilted-rviz2" in broken
    executable = fake_rviz_install(tmp_path / "prefix", monkeypatch)
    assert graph.rviz_problem() == ""  # the real ament_index look-up finds it
    assert executable.is_file()


@pytest.mark.parametrize("sim", ["true", "false"])
def test_every_node_ends_the_launch_when_it_exits_but_rviz(monkeypatch, tmp_path, sim):
    fake_rviz_install(tmp_path, monkeypatch)
    launched = _run_launch(monkeypatch, sim=sim, rviz="true")
    ours = [n for n in launched if n["package"] == graph.PACKAGE]
    assert len(ours) == 3
    running = types.SimpleNamespace(is_shutdown=False)
    stopping = types.SimpleNamespace(is_shutdown=True)
    for node in ours:
        for returncode, how in ((1, "exited with code 1"), (-9, "was killed by SIGKILL"),
                                (0, "exited")):
            # launch turns an exception from a handler into "Caught exception in launch ...:
            # <reason>", stops the other processes and exit code 1 of `ros2 launch`
            with pytest.raises(RuntimeError) as err:
                node["on_exit"](types.SimpleNamespace(returncode=returncode), running)
            assert str(err.value) == f"{node['name']} {how}: stopping every node of the graph"
            # ending while the launch already stops (Ctrl-C, another node's end): no error
            assert node["on_exit"](types.SimpleNamespace(returncode=returncode), stopping) is None
    rviz = [n for n in launched if n["package"] == "rviz2"]
    assert len(rviz) == 1
    # optional: closing rviz2's window (or it finding no display) leaves the graph running
    assert rviz[0]["on_exit"](types.SimpleNamespace(returncode=1), running) is None


def test_stop_rules():
    assert not graph.RVIZ_REQUIRED and not graph.is_required("rviz2")
    assert all(graph.is_required(spec.name) for spec in graph.NODES)
    assert graph.stop_reason("rviz2", "exited") == ""
    assert graph.stop_reason("piper_driver_node", "exited with code 2") == (
        "piper_driver_node exited with code 2: stopping every node of the graph")
    assert graph.exit_description(-15) == "was killed by SIGTERM"
    assert graph.exit_description(-200) == "was killed by signal 200"
    assert graph.exit_description(None) == "ended"


def test_auto_reset_argument(monkeypatch):
    assert graph.LAUNCH_ARGUMENTS["auto_reset"] == ""  # "" = the YAML's (true)
    assert "sim_node" not in graph.launch_overrides({"auto_reset": ""})
    assert graph.launch_overrides({"auto_reset": "False"})["sim_node"] == {"auto_reset": False}
    with pytest.raises(ValueError, match="auto_reset: expected true or false"):
        graph.launch_overrides({"auto_reset": "sometimes"})
    launched = _fake_launch(monkeypatch, {**ARGS, "rviz": "false", "auto_reset": "maybe"})
    description = _load_launch_module().generate_launch_description()
    with pytest.raises(ValueError, match="auto_reset"):
        description[-1].kwargs["function"](None)
    assert launched == []


def test_rviz_package_names_the_distro_or_how_to_find_it(tmp_path, monkeypatch):
    monkeypatch.delenv("ROS_DISTRO", raising=False)
    ros = tmp_path / "ros"
    assert "nothing under" in graph.rviz_package(ros_root=ros)   # no ROS 2 under /opt/ros
    (ros / "jazzy").mkdir(parents=True)
    assert graph.rviz_package(ros_root=ros) == "ros-jazzy-rviz2"
    (ros / "humble").mkdir()
    both = graph.rviz_package(ros_root=ros)
    assert both.startswith("ros-<distro>-rviz2") and "installed here: humble, jazzy" in both
    assert "$" not in both
    monkeypatch.setenv("ROS_DISTRO", "kilted")
    assert graph.rviz_package(ros_root=ros) == "ros-kilted-rviz2"
