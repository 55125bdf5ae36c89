"""The node graph of a deployment, in one table read by the launch file and by heisd-bringup.

``launch/piper_heisd.launch.py`` (``ros2 launch``, a machine with ROS 2) and
``heisd-bringup`` (one process, no ``launch`` package needed) both build the graph from
:data:`NODES` and turn their arguments into parameter overrides with
:func:`launch_overrides`, so the two cannot start different nodes, configs or remappings.
Pure Python: no rclpy, no launch.

Launch arguments (both front ends):
    ``sim`` ("true"/"false"): MuJoCo sim node instead of the PIPER driver.
    ``method``: the policy's decoder, one of :data:`METHODS` ("" = the YAML's, ``heisd``).
    ``model``: small-VLA safetensors for the policy ("" = shipped weights or a random init).
    ``model_type`` ("small"/"openvla", "" = the YAML's, small): the policy's target VLA.
    ``checkpoint``, ``unnorm_key``, ``device``, ``dtype``, ``center_crop``, ``allow_cpu``,
        ``vision_specs``: the OpenVLA target (``model.*`` of ``config/policy_node.yaml``);
        an OpenVLA target on a CPU is refused unless ``allow_cpu:=true``.
    ``drafter``: the policy's draft head ("" = the YAML's: the shipped head for the shipped
        small VLA, else an untrained one).
    ``db``: DB directory built by ``heisd-build-db`` ("" = the YAMLs', ``heisd_db``): the
        retrieval node's ``store.path`` and the policy's ``model.db_dir``, where the policy
        finds the router statistics of the task's suite and the verify-skip calibration.
    ``can_port``: CAN interface of the real arm (driver only).
    ``task``: sim task name and retrieval collection ("" = the YAML's).
    ``rviz`` ("true"/"false"): also start rviz2 with ``config/heisd.rviz`` (launch only).
        rviz2 must be installed: :func:`rviz_problem` is checked before any node starts.
    ``auto_reset`` ("true"/"false", "" = the YAML's, true): the sim node starts the next
        episode by itself when one ends.
    ``sim_mode`` ("realtime"/"lockstep", "" = the YAML's, realtime): the sim's world runs
        with the clock, or one control period per command. In real time the policy steps at
        most once per control period of world time (``min_period_s``, :func:`launch_overrides`):
        each action is a delta for one period of ``sim.control_rate_hz``.
    ``time_scale`` (world s per wall s, "" = the YAML's, 1.0): the real-time sim's speed.
    ``discovery_range``, ``security``, ``keystore``, ``security_strategy``, ``enclave_root``:
        every process's environment (``heisd_ros.nodes.graph_env``): LOCALHOST discovery by
        default, SROS2 when asked.

When a node ends (:func:`stop_reason`): every node of :data:`NODES` is required, so when one
exits or dies, for whatever reason, the launch and heisd-bringup stop all the others and
exit 1 with the reason (the launch file's ``on_exit`` raises it: launch prints it and stops
the other processes): half a graph must not go on (a driver holding the arm while its
policy is gone, or a policy commanding an arm whose driver died). rviz2 is optional
(:data:`RVIZ_REQUIRED`): closing its window, or it failing to open a display on a headless
robot computer, leaves the graph running; so is robot_state_publisher, which the launch adds
when it is installed (``heisd_ros.nodes.robot_description``). Ctrl-C still stops everything
(exit 0).
"""

from __future__ import annotations

import math
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from heisd_ros.decoding.methods import METHOD_NAMES
from heisd_ros.decoding.methods import check_method as check_decoder_method
from heisd_ros.models.loading import DTYPES, MODELS
from heisd_ros.nodes.graph_env import ENV_ARGUMENT_HELP, ENV_ARGUMENTS
from heisd_ros.sim.modes import SIM_MODES

#: The policy's decoder names: the method table's (pure data: no torch in ``ros2 launch``).
METHODS: tuple[str, ...] = METHOD_NAMES
#: Launch arguments and their defaults (strings, as launch passes them).
LAUNCH_ARGUMENTS: dict[str, str] = {
    "sim": "true", "method": "", "model": "", "db": "", "can_port": "can0", "task": "",
    "rviz": "false", "auto_reset": "", "model_type": "", "checkpoint": "", "unnorm_key": "",
    "device": "", "dtype": "", "center_crop": "", "allow_cpu": "", "drafter": "",
    "vision_specs": "", "sim_mode": "", "time_scale": "",
    **ENV_ARGUMENTS,
}
#: What each launch argument does (``ros2 launch ... --show-args``, ``heisd-bringup --help``).
ARGUMENT_HELP: dict[str, str] = {
    "sim": "true: MuJoCo sim node; false: the real PIPER driver",
    "method": f"policy decoder, one of {', '.join(METHODS)} "
              "('' = config/policy_node.yaml's, heisd)",
    "model": "small-VLA safetensors for the policy ('' = shipped weights / random init)",
    "db": "DB directory from heisd-build-db: the retrieval node's store and the policy's "
          "router statistics and calibration ('' = the YAMLs', heisd_db)",
    "can_port": "CAN interface of the PIPER (sim:=false)",
    "task": "sim task and retrieval collection ('' = the YAML's)",
    "rviz": "true: start rviz2 with config/heisd.rviz (rviz2 must be installed)",
    "auto_reset": "sim: start the next episode by itself when one ends, true or false "
                  "('' = config/sim_node.yaml's, true)",
    "model_type": f"policy target VLA, one of {', '.join(MODELS)} ('' = "
                  "config/policy_node.yaml's, small)",
    "checkpoint": "OpenVLA: local checkpoint directory (model_type:=openvla)",
    "unnorm_key": "OpenVLA: dataset_statistics.json key to un-normalise with ('' = the only one)",
    "device": "OpenVLA: cuda, cuda:1 or cpu ('' = CUDA when available)",
    "dtype": f"OpenVLA: one of {', '.join(DTYPES)} ('' = bfloat16 on CUDA, float32 on a CPU)",
    "center_crop": "OpenVLA: crop the central 90% of the image area first, true or false "
                   "(true for checkpoints fine-tuned with random crops, e.g. LIBERO's)",
    "allow_cpu": "OpenVLA: true = run on the CPU (seconds per action: debugging only); "
                 "otherwise an OpenVLA target on a CPU is refused at start",
    "drafter": "draft head safetensors for the policy ('' = the shipped head for the shipped "
               "small VLA; train one for OpenVLA with heisd-train-drafter)",
    "vision_specs": "OpenVLA: JSON of backbone sizes for a checkpoint whose backbones are not "
                    "the ones its config.json names ('' = from config.json)",
    "sim_mode": "sim: realtime (the world runs with the clock, cameras stream) or lockstep "
                "(one control period per command) ('' = config/sim_node.yaml's, realtime)",
    "time_scale": "sim in real time: world seconds per wall second, > 0 (0.5 = the world at "
                  "half speed) ('' = config/sim_node.yaml's, 1.0)",
    **ENV_ARGUMENT_HELP,
}
#: Launch argument -> (node name, parameter name) it sets when not empty.
ARGUMENT_PARAMETERS: dict[str, tuple[tuple[str, str], ...]] = {
    "method": (("policy_node", "method"),),
    "model": (("policy_node", "model.path"),),
    "db": (("retrieval_node", "store.path"), ("policy_node", "model.db_dir")),
    "can_port": (("piper_driver_node", "can_channel"),),
    "task": (("sim_node", "task"), ("policy_node", "task")),
    "auto_reset": (("sim_node", "auto_reset"),),
    "model_type": (("policy_node", "model.type"),),
    "checkpoint": (("policy_node", "model.checkpoint"),),
    "unnorm_key": (("policy_node", "model.unnorm_key"),),
    "device": (("policy_node", "model.device"),),
    "dtype": (("policy_node", "model.dtype"),),
    "center_crop": (("policy_node", "model.center_crop"),),
    "allow_cpu": (("policy_node", "model.allow_cpu"),),
    "drafter": (("policy_node", "model.drafter_path"),),
    "vision_specs": (("policy_node", "model.vision_specs"),),
    "sim_mode": (("sim_node", "mode"),),
    "time_scale": (("sim_node", "time_scale"),),
}
#: Launch arguments whose parameter is a bool (the others set string parameters).
BOOL_ARGUMENTS: tuple[str, ...] = ("auto_reset", "center_crop", "allow_cpu")
#: Launch arguments whose parameter is a float > 0.
FLOAT_ARGUMENTS: tuple[str, ...] = ("time_scale",)
#: Launch arguments with a fixed set of values ("" = the YAML's): argument -> valid values.
CHOICE_ARGUMENTS: dict[str, tuple[str, ...]] = {"model_type": MODELS, "dtype": DTYPES,
                                                "sim_mode": SIM_MODES}
RVIZ_CONFIG = "heisd.rviz"
PACKAGE = "heisd_ros"
#: rviz2's package and executable (what ``launch_ros`` looks up in the ament index).
RVIZ_PACKAGE = RVIZ_EXECUTABLE = "rviz2"
#: rviz2 may end alone (module docstring); every node of NODES is required.
RVIZ_REQUIRED = False
#: robot_state_publisher (``heisd_ros.nodes.robot_description``): started by the launch when
#: installed, and, like rviz2, it may end alone.
ROBOT_STATE_PUBLISHER_PACKAGE = ROBOT_STATE_PUBLISHER_EXECUTABLE = "robot_state_publisher"
ROBOT_STATE_PUBLISHER_REQUIRED = False


@dataclass(frozen=True)
class NodeSpec:
    """One node of the graph.

    Attributes:
        name: node name (also the YAML's top-level key in ``config/<name>.yaml``).
        executable: program in ``nodes/`` (``ros2 run heisd_ros <executable>``).
        module, class_name: where the ``rclpy`` Node class lives (bringup builds it).
        config: parameter file name in ``config/``.
        when: "always", "sim" (only with sim:=true) or "real" (only with sim:=false).
        remappings: (from, to) topic remappings applied to this node.
    """

    name: str
    executable: str
    module: str
    class_name: str
    config: str
    when: str = "always"
    remappings: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.when not in ("always", "sim", "real"):
            raise ValueError(f"when: expected 'always', 'sim' or 'real', got {self.when!r}")


NODES: tuple[NodeSpec, ...] = (
    NodeSpec("policy_node", "policy_node", "heisd_ros.nodes.policy_node", "PolicyNode",
             "policy_node.yaml"),
    NodeSpec("retrieval_node", "retrieval_node", "heisd_ros.nodes.retrieval_node",
             "RetrievalNode", "retrieval_node.yaml"),
    NodeSpec("sim_node", "sim_node", "heisd_ros.nodes.sim_node", "SimNode", "sim_node.yaml",
             when="sim"),
    NodeSpec("piper_driver_node", "piper_driver_node", "heisd_ros.nodes.piper_driver_node",
             "PiperDriverNode", "piper_driver_node.yaml", when="real"),
)


def parse_bool(value: str | bool, name: str) -> bool:
    """A launch argument's truth value ("true"/"false", "1"/"0", any case)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"{name}: expected true or false, got {value!r}")


def nodes_for(sim: bool) -> tuple[NodeSpec, ...]:
    """The nodes started with ``sim`` (the sim node, or the PIPER driver)."""
    wanted = ("always", "sim" if sim else "real")
    return tuple(spec for spec in NODES if spec.when in wanted)


def check_method(value: str) -> str:
    """``value`` if it names a decoder of :data:`METHODS` ("" = the YAML's); else ValueError."""
    text = str(value)
    return check_decoder_method(text) if text else text


def parse_positive(value: str | float, name: str) -> float:
    """A launch argument's number, finite and > 0."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not (math.isfinite(number) and number > 0):
        raise ValueError(f"{name}: expected a number > 0, got {value!r}")
    return number


def launch_overrides(arguments: dict[str, str],
                     sim: bool = False) -> dict[str, dict[str, str | bool | float]]:
    """Parameter overrides per node name from launch arguments (empty arguments set nothing).

    Values are strings, except the bools of :data:`BOOL_ARGUMENTS` and the floats of
    :data:`FLOAT_ARGUMENTS`. With ``sim`` and the sim in real time (``sim_mode``, else the
    YAML's ``mode``), the policy's ``min_period_s`` becomes one control period of world time
    on the wall clock (:func:`sim_control_period_s`), unless the policy YAML sets one.

    Raises:
        ValueError: an unknown argument name (the message lists the valid ones), a
            ``method`` that is not one of :data:`METHODS` or a value of
            :data:`CHOICE_ARGUMENTS` not among its values (the message lists them), or a
            bool argument that is not true or false.
    """
    unknown = sorted(set(arguments) - set(LAUNCH_ARGUMENTS))
    if unknown:
        raise ValueError(f"unknown launch arguments {unknown}; valid: {list(LAUNCH_ARGUMENTS)}")
    check_method(arguments.get("method", LAUNCH_ARGUMENTS["method"]))
    for argument, valid in CHOICE_ARGUMENTS.items():
        value = str(arguments.get(argument, LAUNCH_ARGUMENTS[argument]))
        if value and value not in valid:
            raise ValueError(f"{argument}: unknown value {value!r}; valid: {', '.join(valid)}")
    overrides: dict[str, dict[str, str | bool]] = {}
    for argument, targets in ARGUMENT_PARAMETERS.items():
        value: str | bool = str(arguments.get(argument, LAUNCH_ARGUMENTS[argument]))
        if not value:
            continue
        if argument in BOOL_ARGUMENTS:  # typed: the YAML declares it a bool
            value = parse_bool(value, argument)
        elif argument in FLOAT_ARGUMENTS:
            value = parse_positive(value, argument)
        for node, parameter in targets:
            overrides.setdefault(node, {})[parameter] = value
    if sim:
        period_s = sim_control_period_s(overrides.get("sim_node", {}))
        if period_s and not _shipped("policy_node").get("min_period_s"):
            overrides.setdefault("policy_node", {})["min_period_s"] = period_s
    return overrides


def _shipped(node_name: str) -> dict:
    """The parameters of ``config/<node_name>.yaml``."""
    import yaml

    text = (config_dir() / f"{node_name}.yaml").read_text()
    return yaml.safe_load(text)[node_name]["ros__parameters"]


def sim_control_period_s(sim_overrides: dict) -> float:
    """The wall seconds of one control period of the real-time sim; 0.0 in lockstep.

    From config/sim_node.yaml (``mode``, ``time_scale``, ``sim.control_rate_hz``) with
    ``sim_overrides`` (the sim node's launch overrides) applied.
    """
    shipped = _shipped("sim_node")
    if sim_overrides.get("mode", shipped.get("mode", "realtime")) != "realtime":
        return 0.0
    scale = float(sim_overrides.get("time_scale", shipped.get("time_scale", 1.0)))
    return 1.0 / (float(shipped["sim"]["control_rate_hz"]) * scale)


def config_dir() -> Path:
    """``config/`` of this source checkout when run from one, else of the installed package."""
    source = Path(__file__).resolve().parents[2] / "config"
    if (source / NODES[0].config).is_file():
        return source
    from ament_index_python.packages import get_package_share_directory

    return Path(get_package_share_directory(PACKAGE)) / "config"


def write_params_file(path: Path, node_name: str, overrides: dict,
                      strict: bool = True) -> Path:
    """Write ``config/<node_name>.yaml`` with ``overrides`` applied to ``path``; return it.

    Keys like ``"safety.max_step_translation_m"`` address nested parameters. With ``strict``
    an override of a parameter the shipped YAML lacks is a ValueError (the YAML lists every
    parameter). The file applies to ``/**``, so it holds whatever the node is renamed to.
    """
    import yaml

    merged = _shipped(node_name)
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node = merged
        for part in parents:
            node = node[part]
        if strict and leaf not in node:
            raise ValueError(f"{node_name}: parameter {key} is not in config/{node_name}.yaml")
        node[leaf] = value
    path = Path(path)
    path.write_text(yaml.safe_dump({"/**": {"ros__parameters": merged}}))
    return path


def rviz_package(distro: str | None = None, ros_root: str | Path = "/opt/ros") -> str:
    """The apt package of rviz2 for the install hint (:func:`ros_apt_package`)."""
    return ros_apt_package("rviz2", distro, ros_root)


def ros_apt_package(name: str, distro: str | None = None,
                    ros_root: str | Path = "/opt/ros") -> str:
    """The apt package ``ros-<distro>-<name>`` for an install hint, named for this machine.

    ``distro`` (default ``$ROS_DISTRO``) names it; else the one distribution installed under
    ``ros_root``; else a placeholder with how to find the name (never a literal
    ``$ROS_DISTRO``, which an unset variable would print as is).
    """
    distro = distro if distro is not None else os.environ.get("ROS_DISTRO", "")
    if distro:
        return f"ros-{distro}-{name}"
    root = Path(ros_root)
    installed = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    if len(installed) == 1:
        return f"ros-{installed[0]}-{name}"
    found = (f"installed here: {', '.join(installed)}" if installed
             else f"nothing under {root}")
    return (f"ros-<distro>-{name}, <distro> being your ROS 2 release such as humble or jazzy "
            f"(ROS_DISTRO is unset; {found})")


def rviz_problem(find_prefix: Callable[[str], str] | None = None,
                 distro: str | None = None) -> str:
    """Why ``rviz:=true`` cannot start rviz2 on this machine; "" if it can.

    Checks what ``launch_ros`` will need, before any node is started: the ``rviz2`` package in
    the ament index (``AMENT_PREFIX_PATH``) and its executable ``<prefix>/lib/rviz2/rviz2``.
    Without the check the launch started the nodes, then failed on rviz2 and left them
    running with no Ctrl-C to stop them (with ``sim:=false``, the PIPER driver).

    Args:
        find_prefix: package name -> install prefix, raising LookupError (ament_index's
            PackageNotFoundError is one) when it is not installed; default: ament_index's
            ``get_package_prefix``.
        distro: ROS 2 distribution for the install hint; default: ``$ROS_DISTRO`` (see
            :func:`rviz_package`).
    """
    package = rviz_package(distro)
    hint = (f"install it (sudo apt-get install {package}) and source the ROS 2 setup again, "
            f"or launch with rviz:=false; no node was started")
    if find_prefix is None:
        try:
            from ament_index_python.packages import get_package_prefix as find_prefix
        except ImportError:
            return f"rviz:=true but ament_index_python is missing (not a ROS 2 shell?): {hint}"
    try:
        prefix = Path(find_prefix(RVIZ_PACKAGE))
    except LookupError:
        return (f"rviz:=true but rviz2 is not installed (no package {RVIZ_PACKAGE!r} in "
                f"AMENT_PREFIX_PATH): {hint}")
    executable = prefix / "lib" / RVIZ_PACKAGE / RVIZ_EXECUTABLE
    if not (executable.is_file() and os.access(executable, os.X_OK)):
        return f"rviz:=true but {executable} is not an executable file: {hint}"
    return ""


def is_required(name: str) -> bool:
    """Whether the graph stops when program ``name`` ends: every node but the viewers' is.

    The viewers are rviz2 and robot_state_publisher.
    """
    if name == RVIZ_EXECUTABLE:
        return RVIZ_REQUIRED
    if name == ROBOT_STATE_PUBLISHER_EXECUTABLE:
        return ROBOT_STATE_PUBLISHER_REQUIRED
    return True


def exit_description(returncode: int | None) -> str:
    """How a process ended, from its exit code (negative: killed by that signal)."""
    if returncode is None:
        return "ended"
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return "exited" if returncode == 0 else f"exited with code {returncode}"


def stop_reason(name: str, how: str) -> str:
    """Why the whole graph stops because program ``name`` ended ``how``; "" = it may end alone.

    ``how`` is :func:`exit_description`'s text (launch) or the error (heisd-bringup).
    """
    if not is_required(name):
        return ""
    return f"{name} {how}: stopping every node of the graph"
