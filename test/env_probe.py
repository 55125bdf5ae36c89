"""A node for heisd-bringup's process test: it fails to start, naming the environment it saw.

``heisd_ros.tools.bringup.run`` builds it like any node of the graph; its constructor raises,
so bringup prints the message (``failed to start (RuntimeError: ...)``) and exits 1.
"""

from __future__ import annotations

import json
import os

from rclpy.node import Node

#: The variables the graph's processes get (heisd_ros.nodes.graph_env).
KEYS = ("ROS_AUTOMATIC_DISCOVERY_RANGE", "ROS_LOCALHOST_ONLY", "ROS_SECURITY_ENABLE",
        "ROS_SECURITY_STRATEGY", "ROS_SECURITY_KEYSTORE")


class EnvProbe(Node):
    """Raises ``RuntimeError("environment {json}")`` once it is a node in bringup's context."""

    def __init__(self, name: str, **kwargs) -> None:
        super().__init__(name, **kwargs)
        seen = {key: os.environ.get(key) for key in KEYS}
        raise RuntimeError(f"environment {json.dumps(seen, sort_keys=True)}")
