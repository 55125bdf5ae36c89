"""What every process of the graph gets in its environment: discovery range and SROS2 security.

The launch file and ``heisd-bringup`` read these launch arguments (part of
``heisd_ros.nodes.graph.LAUNCH_ARGUMENTS``) and hand :func:`process_environment` to each
process they start (the launch: ``additional_env`` of every node, rviz2 and
robot_state_publisher included; heisd-bringup: its own environment before ``rclpy.init``, as
its nodes share one process). Pure Python: no rclpy, no launch.

``discovery_range`` (default ``LOCALHOST``): how far nodes look for each other
(``ROS_AUTOMATIC_DISCOVERY_RANGE``). ``LOCALHOST``: only this computer, so one robot computer
runs the whole graph and nothing on the network sees or commands it; ``SUBNET``: every host
reachable by multicast on the local network can discover, subscribe and publish (cameras or a
GPU box elsewhere; also anyone else on that network); ``OFF``: no discovery, not even on this
computer (static peers only); ``SYSTEM_DEFAULT``: set nothing, the shell's settings stand.
Humble has no ``ROS_AUTOMATIC_DISCOVERY_RANGE``: there ``ROS_LOCALHOST_ONLY=1`` (``LOCALHOST``)
or ``0`` (``SUBNET``) is set, and ``OFF`` is refused. On later distributions
``ROS_LOCALHOST_ONLY=0`` is set beside the range, so a deprecated ``ROS_LOCALHOST_ONLY=1`` left
in the shell (Jazzy still honours it, above the range) cannot override the chosen range.

``security`` (default false) with ``keystore`` (a ``ros2 security create_keystore`` directory),
``security_strategy`` (``Enforce``: a node without valid keys does not start; ``Permissive``:
it runs unsecured) and ``enclave_root`` (default ``/heisd``): every process gets
``ROS_SECURITY_ENABLE=true``, ``ROS_SECURITY_STRATEGY`` and ``ROS_SECURITY_KEYSTORE``, and its
own enclave ``<enclave_root>/<node name>`` (``--ros-args --enclave``, :func:`enclave_arguments`;
heisd-bringup's one process: ``<enclave_root>/heisd_bringup``). Each enclave must exist in the
keystore (``ros2 security create_enclave <keystore> /heisd/piper_driver_node``). Whether DDS
enforces it depends on the middleware build: the Fast DDS of the PyPI wheels has no security
plugins, so there these settings reach the processes but protect nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Values of ``discovery_range``.
DISCOVERY_RANGES = ("LOCALHOST", "SUBNET", "OFF", "SYSTEM_DEFAULT")
#: Values of ``security_strategy``.
SECURITY_STRATEGIES = ("Enforce", "Permissive")
#: The enclave of heisd-bringup's one process (under ``enclave_root``).
BRINGUP_ENCLAVE = "heisd_bringup"
#: The arguments and their defaults (strings, as launch passes them).
ENV_ARGUMENTS: dict[str, str] = {
    "discovery_range": "LOCALHOST", "security": "false", "keystore": "",
    "security_strategy": "Enforce", "enclave_root": "/heisd",
}
ENV_ARGUMENT_HELP: dict[str, str] = {
    "discovery_range": "how far nodes discover each other: LOCALHOST (this computer only), "
                       "SUBNET (every host on the local network, which can then also command "
                       "the graph), OFF, or SYSTEM_DEFAULT (the shell's setting)",
    "security": "true: SROS2 for every node (needs keystore; enforced only by a DDS built with "
                "security plugins, not the PyPI Fast DDS)",
    "keystore": "SROS2 keystore directory (ros2 security create_keystore), for security:=true",
    "security_strategy": "SROS2 strategy: Enforce (a node without valid keys does not start) "
                         "or Permissive",
    "enclave_root": "SROS2 enclaves: <enclave_root>/<node name> per node",
}


def _value(values: dict[str, str], name: str) -> str:
    return str(values.get(name, ENV_ARGUMENTS[name])).strip()


def _security_on(values: dict[str, str]) -> bool:
    from heisd_ros.nodes.graph import parse_bool

    return parse_bool(_value(values, "security"), "security")


def discovery_environment(values: dict[str, str], distro: str | None = None) -> dict[str, str]:
    """The discovery variables for ``discovery_range`` on ``distro`` (default ``$ROS_DISTRO``).

    Raises:
        ValueError: an unknown range (the message lists the valid ones), or ``OFF`` on Humble.
    """
    scope = _value(values, "discovery_range").upper()
    if scope not in DISCOVERY_RANGES:
        raise ValueError(f"discovery_range: unknown value {scope!r}; valid: "
                         f"{', '.join(DISCOVERY_RANGES)}")
    if scope == "SYSTEM_DEFAULT":
        return {}
    distro = (os.environ.get("ROS_DISTRO", "") if distro is None else distro).lower()
    if distro == "humble":
        if scope == "OFF":
            raise ValueError("discovery_range: OFF needs ROS 2 Iron or newer; Humble offers "
                             "LOCALHOST (ROS_LOCALHOST_ONLY=1) or SUBNET")
        return {"ROS_LOCALHOST_ONLY": "1" if scope == "LOCALHOST" else "0"}
    return {"ROS_AUTOMATIC_DISCOVERY_RANGE": scope, "ROS_LOCALHOST_ONLY": "0"}


def security_environment(values: dict[str, str]) -> dict[str, str]:
    """The SROS2 variables (all but the enclave) when ``security`` is on; {} when off.

    Raises:
        ValueError: ``security`` is not true/false, ``keystore`` is not a directory, or an
            unknown ``security_strategy``.
    """
    if not _security_on(values):
        return {}
    keystore = _value(values, "keystore")
    if not keystore or not Path(keystore).is_dir():
        raise ValueError(f"keystore: security needs the keystore directory (create it with "
                         f"`ros2 security create_keystore DIR`), got {keystore!r}")
    strategy = _value(values, "security_strategy")
    if strategy not in SECURITY_STRATEGIES:
        raise ValueError(f"security_strategy: unknown value {strategy!r}; valid: "
                         f"{', '.join(SECURITY_STRATEGIES)}")
    return {"ROS_SECURITY_ENABLE": "true", "ROS_SECURITY_STRATEGY": strategy,
            "ROS_SECURITY_KEYSTORE": str(Path(keystore).resolve())}


def process_environment(values: dict[str, str], distro: str | None = None) -> dict[str, str]:
    """Every variable a process of the graph gets (discovery, then security)."""
    return {**discovery_environment(values, distro), **security_environment(values)}


def enclave(values: dict[str, str], process: str) -> str:
    """The SROS2 enclave of ``process`` (a node or program name); "" with security off."""
    if not _security_on(values):
        return ""
    root = _value(values, "enclave_root").rstrip("/")
    if not root.startswith("/"):
        raise ValueError(f"enclave_root: expected an absolute enclave path like '/heisd', "
                         f"got {root!r}")
    return f"{root}/{process}"


def enclave_arguments(values: dict[str, str], process: str) -> list[str]:
    """``--ros-args --enclave <enclave>`` for ``process``; [] with security off."""
    name = enclave(values, process)
    return ["--ros-args", "--enclave", name] if name else []
