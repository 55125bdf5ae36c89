"""Discovery range and SROS2 settings reach every process of the launch and of heisd-bringup.

The launch file runs against the stand-ins of test_bringup.py (``launch`` is not installable
here) and what each ``Node`` action was given is inspected; heisd-bringup is checked through
its plan, its dry run and, for real, in a process of its own. The PyPI Fast DDS has no
security plugins, so only that the settings arrive is tested, not that DDS enforces them.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from heisd_ros.nodes import graph, graph_env
from heisd_ros.tools import bringup
from test.node_process import repo_env
from test.test_bringup import ARGS, _fake_launch, _load_launch_module, fake_rviz_install

LOCAL = {"ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST", "ROS_LOCALHOST_ONLY": "0"}


def launched(monkeypatch, tmp_path, distro: str = "kilted", **values) -> list[dict]:
    """The kwargs of every Node action of ``ros2 launch ... rviz:=true`` with ``values``."""
    fake_rviz_install(tmp_path / "rviz_prefix", monkeypatch)
    monkeypatch.setenv("ROS_DISTRO", distro)
    nodes = _fake_launch(monkeypatch, {**graph.LAUNCH_ARGUMENTS, **ARGS, **values})
    description = _load_launch_module().generate_launch_description()
    description[-1].kwargs["function"](None)
    return nodes


def test_the_launch_keeps_discovery_on_this_computer_by_default(monkeypatch, tmp_path):
    _fake_launch(monkeypatch, dict(graph.LAUNCH_ARGUMENTS))
    description = _load_launch_module().generate_launch_description()
    declared = {a.args[0]: a.kwargs["default_value"] for a in description[:-1]}
    assert declared["discovery_range"] == "LOCALHOST" and declared["security"] == "false"
    for sim in ("true", "false"):
        nodes = launched(monkeypatch, tmp_path / sim, sim=sim)
        names = {n["name"] for n in nodes}
        assert {"policy_node", "retrieval_node", "rviz2"} <= names
        assert ("piper_driver_node" in names) == (sim == "false")
        for node in nodes:  # our nodes, the viewers and rviz2 alike
            assert node["additional_env"] == LOCAL, node["name"]
            assert "--enclave" not in node["arguments"], node["name"]


@pytest.mark.parametrize("scope", ["SUBNET", "OFF", "subnet"])
def test_discovery_range_widens_or_narrows_it(monkeypatch, tmp_path, scope):
    for node in launched(monkeypatch, tmp_path, sim="false", discovery_range=scope):
        assert node["additional_env"] == {"ROS_AUTOMATIC_DISCOVERY_RANGE": scope.upper(),
                                          "ROS_LOCALHOST_ONLY": "0"}


def test_system_default_sets_nothing_and_humble_gets_localhost_only(monkeypatch, tmp_path):
    for node in launched(monkeypatch, tmp_path, discovery_range="SYSTEM_DEFAULT"):
        assert node["additional_env"] == {}
    for node in launched(monkeypatch, tmp_path / "h", distro="humble"):
        assert node["additional_env"] == {"ROS_LOCALHOST_ONLY": "1"}
    assert graph_env.discovery_environment({"discovery_range": "SUBNET"}, "humble") == {
        "ROS_LOCALHOST_ONLY": "0"}
    with pytest.raises(ValueError, match="OFF needs ROS 2 Iron"):
        graph_env.discovery_environment({"discovery_range": "OFF"}, "humble")


def test_security_reaches_every_node_with_its_own_enclave(monkeypatch, tmp_path):
    keystore = tmp_path / "keystore"
    keystore.mkdir()
    nodes = launched(monkeypatch, tmp_path, sim="false", security="true",
                     keystore=str(keystore), enclave_root="/robot1/")
    assert {n["name"] for n in nodes} >= {"policy_node", "retrieval_node", "piper_driver_node",
                                          "rviz2"}
    for node in nodes:
        assert node["additional_env"] == {**LOCAL, "ROS_SECURITY_ENABLE": "true",
                                          "ROS_SECURITY_STRATEGY": "Enforce",
                                          "ROS_SECURITY_KEYSTORE": str(keystore)}, node["name"]
        assert node["arguments"][-3:] == ["--ros-args", "--enclave",
                                          f"/robot1/{node['name']}"], node["arguments"]
    rviz = next(n for n in nodes if n["name"] == "rviz2")
    assert rviz["arguments"][:2] == ["-d", rviz["arguments"][1]]
    assert rviz["arguments"][1].endswith("config/heisd.rviz")
    permissive = launched(monkeypatch, tmp_path / "p", security="true", keystore=str(keystore),
                          security_strategy="Permissive")
    assert {n["additional_env"]["ROS_SECURITY_STRATEGY"] for n in permissive} == {"Permissive"}


@pytest.mark.parametrize(("values", "words"), [
    ({"security": "true"}, "keystore: security needs the keystore directory"),
    ({"security": "true", "keystore": "/nonexistent/keystore"}, "/nonexistent/keystore"),
    ({"security": "maybe"}, "security: expected true or false"),
    ({"discovery_range": "WAN"}, "discovery_range: unknown value 'WAN'; valid: LOCALHOST"),
])
def test_bad_settings_stop_the_launch_before_any_node(monkeypatch, tmp_path, values, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        launched(monkeypatch, tmp_path, **values)
    nodes = _fake_launch(monkeypatch, {**graph.LAUNCH_ARGUMENTS, **values})
    with pytest.raises(ValueError):
        _load_launch_module().generate_launch_description()[-1].kwargs["function"](None)
    assert nodes == []


def test_bringup_sets_the_same_environment_and_one_enclave(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("ROS_DISTRO", "kilted")
    assert bringup.main(["--dry-run"]) == 0
    assert f"environment: {LOCAL} enclave: \n" in capsys.readouterr().out
    assert bringup.main(["--dry-run", "--security", "true", "--keystore", str(tmp_path),
                         "--discovery-range", "SUBNET"]) == 0
    out = capsys.readouterr().out
    assert "'ROS_AUTOMATIC_DISCOVERY_RANGE': 'SUBNET'" in out
    assert f"'ROS_SECURITY_KEYSTORE': '{tmp_path}'" in out
    assert "enclave: /heisd/heisd_bringup" in out
    env, enclave = bringup.process_settings({"security": "true", "keystore": str(tmp_path)})
    args = bringup.ros_arguments(bringup.node_plan({"sim": "false"}), enclave)
    assert args[0] == "--ros-args" and args.count("--ros-args") == 1
    assert args[-2:] == ["--enclave", "/heisd/heisd_bringup"]
    assert bringup.main(["--dry-run", "--security", "true"]) == 2
    assert "keystore" in capsys.readouterr().err


def test_bringup_puts_the_environment_into_its_process_before_the_nodes_start(tmp_path):
    # A plan of one probe node, whose constructor reports the environment it sees; Permissive,
    # as the empty keystore has no enclave (and the PyPI Fast DDS no security plugins).
    script = (
        "from heisd_ros.nodes.graph import NodeSpec\n"
        "from heisd_ros.tools import bringup\n"
        "values = {'discovery_range': 'SUBNET', 'security': 'true',\n"
        f"          'keystore': {str(tmp_path)!r}, 'security_strategy': 'Permissive'}}\n"
        "env, enclave = bringup.process_settings(values)\n"
        "spec = NodeSpec('env_probe', 'env_probe', 'test.env_probe', 'EnvProbe',\n"
        "                'policy_node.yaml')\n"
        "plan = [{'spec': spec, 'params_file': str(bringup.config_dir() / spec.config),\n"
        "         'overrides': {}, 'remappings': []}]\n"
        "bringup.run(plan, 1, env, enclave)\n"
    )
    env = repo_env(ROS_DISTRO="kilted", ROS_AUTOMATIC_DISCOVERY_RANGE="OFF")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=120, cwd=bringup.config_dir().parent)
    assert done.returncode == 1, done.stderr[-3000:]
    line = next(x for x in done.stderr.splitlines() if "failed to start" in x)
    seen, _ = json.JSONDecoder().raw_decode(line.split("environment ", 1)[1])
    assert seen == {"ROS_AUTOMATIC_DISCOVERY_RANGE": "SUBNET", "ROS_LOCALHOST_ONLY": "0",
                    "ROS_SECURITY_ENABLE": "true", "ROS_SECURITY_KEYSTORE": str(tmp_path),
                    "ROS_SECURITY_STRATEGY": "Permissive"}
