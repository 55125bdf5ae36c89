"""The launch file and heisd-bringup read one node table and cannot drift.

``launch``/``launch_ros`` are not installable here: the launch file is run against small
stand-ins that record what it asks for, and compared with heisd-bringup's plan.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import sys
import types
from pathlib import Path

import pytest
import yaml

from heisd_ros.nodes import graph
from heisd_ros.tools import bringup

REPO = Path(__file__).resolve().parents[1]
LAUNCH_FILE = REPO / "launch" / "piper_heisd.launch.py"
ARGS = {"sim": "true", "method": "router_skip", "model": "/m/vla.safetensors", "db": "/d/db",
        "can_port": "can1", "task": "stack_blue_on_red", "rviz": "true", "auto_reset": "false"}
#: ``ros2 launch heisd_ros piper_heisd.launch.py sim:=false model_type:=openvla ...``
OPENVLA_ARGS = {**ARGS, "sim": "false", "model": "", "model_type": "openvla",
                "checkpoint": "/c/openvla-7b-finetuned-libero-spatial",
                "unnorm_key": "libero_spatial", "device": "cuda", "dtype": "bfloat16",
                "center_crop": "true", "allow_cpu": "false", "drafter": "/c/head.safetensors"}


class _Recorder:
    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


def _fake_launch(monkeypatch, values):
    """Stand-in launch/launch_ros modules; returns the list Node(...) calls land in."""
    nodes = []

    class LaunchConfiguration:
        def __init__(self, name):
            self.name = name

        def perform(self, _context):
            # launch: the given value, else the declared default
            return values.get(self.name, graph.LAUNCH_ARGUMENTS[self.name])

    class Node(_Recorder):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            nodes.append(kwargs)

    modules = {
        "launch": types.SimpleNamespace(LaunchDescription=lambda actions: actions),
        "launch.actions": types.SimpleNamespace(DeclareLaunchArgument=_Recorder,
                                                OpaqueFunction=_Recorder, Shutdown=_Recorder,
                                                LogInfo=_Recorder),
        "launch.substitutions": types.SimpleNamespace(LaunchConfiguration=LaunchConfiguration),
        "launch_ros": types.SimpleNamespace(),
        "launch_ros.actions": types.SimpleNamespace(Node=Node),
    }
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    return nodes


def fake_rviz_install(prefix: Path, monkeypatch) -> Path:
    """An ament prefix with an ``rviz2`` package and executable, first in AMENT_PREFIX_PATH."""
    (prefix / "share" / "ament_index" / "resource_index" / "packages").mkdir(parents=True)
    (prefix / "share" / "ament_index" / "resource_index" / "packages" / "rviz2").write_text("")
    executable = prefix / "lib" / "rviz2" / "rviz2"
    executable.parent.mkdir(parents=True)
    executable.write_text("#!/bin/sh\n")
    executable.chmod(0o755)
    monkeypatch.setenv("AMENT_PREFIX_PATH", os.pathsep.join(
        [str(prefix), *filter(None, os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep))]))
    return executable


def _load_launch_module():
    spec = importlib.util.spec_from_file_location("piper_heisd_launch", LAUNCH_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # must not need `launch` at import time
    return module


def test_launch_file_imports_launch_only_inside_functions():
    tree = ast.parse(LAUNCH_FILE.read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    for node in top:
        names = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
        assert not any(n.split(".")[0] in ("launch", "launch_ros") for n in names), names
    module = _load_launch_module()
    assert callable(module.generate_launch_description)


@pytest.mark.parametrize(("sim", "args"), [("true", ARGS), ("false", ARGS),
                                           ("true", OPENVLA_ARGS), ("false", OPENVLA_ARGS)],
                         ids=["sim", "real", "sim-openvla", "real-openvla"])
def test_launch_and_bringup_start_the_same_nodes(monkeypatch, tmp_path, sim, args):
    fake_rviz_install(tmp_path, monkeypatch)  # rviz:=true needs rviz2 installed
    # what launch hands the OpaqueFunction: every declared argument, given or default
    values = {**graph.LAUNCH_ARGUMENTS, **args, "sim": sim}
    launched = _fake_launch(monkeypatch, values)
    module = _load_launch_module()
    description = module.generate_launch_description()
    declared = {a.args[0]: a.kwargs["default_value"] for a in description[:-1]}
    assert declared == graph.LAUNCH_ARGUMENTS
    for name in ("sim", "method", "model", "db", "can_port", "task", "rviz", "auto_reset"):
        assert name in declared
    assert {a.args[0]: a.kwargs["description"] for a in description[:-1]} == graph.ARGUMENT_HELP
    description[-1].kwargs["function"](None)

    plan = bringup.node_plan({k: v for k, v in values.items() if k != "rviz"})
    ours = [n for n in launched if n["package"] == graph.PACKAGE]
    assert [n["name"] for n in ours] == [item["spec"].name for item in plan]
    for node, item in zip(ours, plan, strict=True):
        assert node["executable"] == item["spec"].executable
        assert node["parameters"] == [item["params_file"], item["overrides"]]
        assert node["remappings"] == item["remappings"]
    names = [n["name"] for n in ours]
    assert ("sim_node" in names) == (sim == "true")
    assert ("piper_driver_node" in names) == (sim == "false")
    rviz = [n for n in launched if n["package"] == "rviz2"]
    assert rviz and rviz[0]["arguments"][-1].endswith("config/heisd.rviz")


def test_arguments_become_the_right_parameters():
    overrides = graph.launch_overrides(ARGS)
    assert overrides["policy_node"] == {"method": "router_skip", "model.path": "/m/vla.safetensors",
                                        "model.db_dir": "/d/db", "task": "stack_blue_on_red"}
    assert overrides["retrieval_node"] == {"store.path": "/d/db"}
    assert overrides["piper_driver_node"] == {"can_channel": "can1"}
    assert overrides["sim_node"] == {"task": "stack_blue_on_red", "auto_reset": False}
    assert "policy_node" not in graph.launch_overrides({"model": ""})
    with pytest.raises(ValueError, match="unknown launch arguments"):
        graph.launch_overrides({"modle": "x"})


def test_the_real_time_sim_paces_the_policy_at_its_control_period():
    """Real time (the YAML's): the policy decides at most once per world control period.

    On the wall clock; lockstep and the real arm leave the policy's period alone.
    """
    assert graph.launch_overrides({}, sim=True)["policy_node"] == {"min_period_s": 0.1}
    slow = graph.launch_overrides({"time_scale": "0.5"}, sim=True)
    assert slow["sim_node"] == {"time_scale": 0.5}
    assert slow["policy_node"] == {"min_period_s": pytest.approx(0.2)}
    lockstep = graph.launch_overrides({"sim_mode": "lockstep"}, sim=True)
    assert lockstep["sim_node"] == {"mode": "lockstep"} and "policy_node" not in lockstep
    assert "policy_node" not in graph.launch_overrides({}, sim=False)  # the real arm
    for argument, bad, message in (("sim_mode", "fast", "sim_mode: unknown value 'fast'"),
                                   ("time_scale", "0", "time_scale: expected a number > 0"),
                                   ("time_scale", "nan", "time_scale: expected a number > 0"),
                                   ("time_scale", "x", "time_scale: expected a number > 0")):
        with pytest.raises(ValueError, match=message):
            graph.launch_overrides({argument: bad}, sim=True)


def test_openvla_arguments_become_the_policy_model_parameters(tmp_path):
    """model_type:=openvla checkpoint:=DIR ... -> the policy's model.* -> its TargetChoice."""
    from heisd_ros.models.loading import check_device_allowed
    from heisd_ros.nodes.policy_decoders import ModelConfig

    overrides = graph.launch_overrides(OPENVLA_ARGS)
    assert overrides["policy_node"] == {
        "method": "router_skip", "model.db_dir": "/d/db", "task": "stack_blue_on_red",
        "model.type": "openvla", "model.checkpoint": "/c/openvla-7b-finetuned-libero-spatial",
        "model.unnorm_key": "libero_spatial", "model.device": "cuda", "model.dtype": "bfloat16",
        "model.center_crop": True, "model.allow_cpu": False,
        "model.drafter_path": "/c/head.safetensors"}
    # the file the launch hands the node, read back as the node reads model.*
    params = yaml.safe_load(graph.write_params_file(
        tmp_path / "policy.yaml", "policy_node", overrides["policy_node"]).read_text())
    choice = ModelConfig(**params["/**"]["ros__parameters"]["model"]).target_choice()
    assert (choice.model, choice.checkpoint, choice.unnorm_key, choice.device, choice.dtype,
            choice.center_crop, choice.allow_cpu, choice.path) == (
        "openvla", "/c/openvla-7b-finetuned-libero-spatial", "libero_spatial", "cuda",
        "bfloat16", True, False, None)
    cpu = graph.launch_overrides({**OPENVLA_ARGS, "device": "cpu"})["policy_node"]
    params = yaml.safe_load(graph.write_params_file(
        tmp_path / "cpu.yaml", "policy_node", cpu).read_text())
    with pytest.raises(ValueError, match="allow_cpu:=true"):
        check_device_allowed(ModelConfig(**params["/**"]["ros__parameters"]["model"])
                             .target_choice(), "model.allow_cpu: true (launch argument "
                             "allow_cpu:=true)")
    # the YAML's defaults: the small VLA, nothing OpenVLA set
    assert ModelConfig(**yaml.safe_load((REPO / "config" / "policy_node.yaml").read_text())[
        "policy_node"]["ros__parameters"]["model"]).target_choice().model == "small"


@pytest.mark.parametrize(("argument", "bad", "message"), [
    ("model_type", "openvla-7b", "model_type: unknown value 'openvla-7b'; valid: small, openvla"),
    ("dtype", "fp16", "dtype: unknown value 'fp16'; valid: bfloat16, float16, float32"),
    ("center_crop", "maybe", "center_crop: expected true or false"),
    ("allow_cpu", "yes please", "allow_cpu: expected true or false")])
def test_bad_openvla_arguments_are_refused_before_any_node(monkeypatch, capsys, argument, bad,
                                                            message):
    with pytest.raises(ValueError) as err:
        graph.launch_overrides({**OPENVLA_ARGS, argument: bad})
    assert str(err.value).startswith(message)
    launched = _fake_launch(monkeypatch, {**graph.LAUNCH_ARGUMENTS, **OPENVLA_ARGS,
                                          argument: bad, "rviz": "false"})
    with pytest.raises(ValueError, match=argument):
        _load_launch_module().generate_launch_description()[-1].kwargs["function"](None)
    assert launched == []
    flag = f"--{argument.replace('_', '-')}"
    assert bringup.main(["--dry-run", "--model-type", "openvla", "--checkpoint", "/c", flag,
                         bad]) == 2
    assert capsys.readouterr().err.startswith(f"heisd-bringup: {message}")


def test_a_small_vla_with_openvla_options_is_refused_by_the_node_config():
    from heisd_ros.nodes.policy_decoders import ModelConfig

    with pytest.raises(ValueError, match="checkpoint: OpenVLA options"):
        ModelConfig(checkpoint="/c")
    with pytest.raises(ValueError, match="needs a checkpoint directory"):
        ModelConfig(type="openvla")
    with pytest.raises(ValueError, match="model: expected one of"):
        ModelConfig(type="llama")


def test_method_names_are_the_method_table():
    """graph.METHODS is the method table's (test_method_table.py checks every front end)."""
    from heisd_ros.decoding.methods import METHOD_NAMES

    assert graph.METHODS == METHOD_NAMES
    assert graph.LAUNCH_ARGUMENTS["method"] == ""  # "" = the YAML's, which is heisd
    policy = yaml.safe_load((REPO / "config" / "policy_node.yaml").read_text())
    assert policy["policy_node"]["ros__parameters"]["method"] == "heisd"
    assert policy["policy_node"]["ros__parameters"]["model"]["db_dir"] == yaml.safe_load(
        (REPO / "config" / "retrieval_node.yaml").read_text())["retrieval_node"][
        "ros__parameters"]["store"]["path"]  # both default to the same DB directory


@pytest.mark.parametrize("method", graph.METHODS)
def test_every_method_is_accepted(method):
    assert graph.launch_overrides({"method": method})["policy_node"] == {"method": method}


@pytest.mark.parametrize("bad", ["hiesd", "HEISD", " heisd", "drafter,ar"])
def test_an_unknown_method_is_refused_naming_the_valid_ones(monkeypatch, capsys, bad):
    with pytest.raises(ValueError) as err:
        graph.launch_overrides({"method": bad})
    from heisd_ros.decoding.methods import METHOD_NAMES

    assert str(err.value) == f"method: unknown method {bad!r}; valid: {', '.join(METHOD_NAMES)}"
    # the launch file: the same error from its OpaqueFunction, and no node is started
    launched = _fake_launch(monkeypatch, {**ARGS, "method": bad})
    description = _load_launch_module().generate_launch_description()
    with pytest.raises(ValueError, match="unknown method"):
        description[-1].kwargs["function"](None)
    assert launched == []
    # heisd-bringup: a message and exit code 2, nothing started
    assert bringup.main(["--dry-run", "--method", bad]) == 2
    assert capsys.readouterr().err.startswith("heisd-bringup: method: unknown method")


@pytest.mark.parametrize("spec", graph.NODES, ids=lambda s: s.name)
def test_every_table_entry_exists(spec):
    """Executable, config (keyed by the node name) and class are real.

    Every parameter a launch argument sets is declared in that node's YAML.
    """
    assert (REPO / "nodes" / spec.executable).is_file()
    config = yaml.safe_load((REPO / "config" / spec.config).read_text())
    assert list(config) == [spec.name]
    params = config[spec.name]["ros__parameters"]
    for node, parameter in (t for ts in graph.ARGUMENT_PARAMETERS.values() for t in ts):
        if node == spec.name:
            value = params
            for part in parameter.split("."):
                value = value[part]  # KeyError: the YAML does not have it
    source = (REPO / Path(*spec.module.split("."))).with_suffix(".py").read_text()
    assert f"class {spec.class_name}(Node)" in source


def test_rviz_config_shows_path_markers_and_both_cameras():
    rviz = yaml.safe_load((REPO / "config" / graph.RVIZ_CONFIG).read_text())
    manager = rviz["Visualization Manager"]
    assert manager["Global Options"]["Fixed Frame"] == "base_link"
    topics = {d["Class"]: [] for d in manager["Displays"]}
    for display in manager["Displays"]:
        if "Topic" in display:
            topics[display["Class"]].append(display["Topic"]["Value"])
    assert topics["rviz_default_plugins/Path"] == ["/heisd/ee_path"]
    assert topics["rviz_default_plugins/MarkerArray"] == ["/heisd/router_markers"]
    assert sorted(topics["rviz_default_plugins/Image"]) == [
        "/camera/third_person/image_raw", "/camera/wrist/image_raw"]


def test_bringup_dry_run_and_ros_arguments(capsys):
    assert bringup.main(["--dry-run", "--task", "stack_blue_on_red", "--db", "/d/db"]) == 0
    out = capsys.readouterr().out
    assert "sim_node:" in out and "'task': 'stack_blue_on_red'" in out
    assert "'model.db_dir': '/d/db'" in out and "'store.path': '/d/db'" in out
    assert bringup.main(["--dry-run", "--model-type", "openvla", "--checkpoint", "/c/ckpt",
                         "--unnorm-key", "libero_spatial", "--allow-cpu", "true"]) == 0
    out = capsys.readouterr().out
    assert ("'model.type': 'openvla', 'model.checkpoint': '/c/ckpt', 'model.unnorm_key': "
            "'libero_spatial', 'model.allow_cpu': True") in out
    plan = bringup.node_plan({"sim": "false"})
    args = bringup.ros_arguments(plan)
    assert args[0] == "--ros-args"
    assert args.count("--params-file") == len(plan) == 3
    tools = re.search(r"TOOLS = \[([^\]]*)\]", (REPO / "setup.py").read_text()).group(1)
    assert '"bringup"' in tools  # heisd-bringup is installed
