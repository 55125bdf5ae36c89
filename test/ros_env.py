"""Gate for tests that need rclpy and the built interfaces.

``scripts/run_tests.sh`` sets ``HEISD_REQUIRE_ROS=1``: there a missing ROS or a missing colcon
build is a failure, not a skip. A plain ``pytest`` on a machine without ROS skips these tests.
"""

from __future__ import annotations

import importlib
import os

import pytest


def require_ros():
    """Return ``(rclpy, heisd_ros.msg, heisd_ros.srv)`` or skip/fail as the environment says."""
    try:
        rclpy = importlib.import_module("rclpy")
        msg = importlib.import_module("heisd_ros.msg")
        srv = importlib.import_module("heisd_ros.srv")
    except ImportError as exc:
        if os.environ.get("HEISD_REQUIRE_ROS") == "1":
            pytest.fail(f"ROS 2 or the colcon-built heisd_ros interfaces are missing: {exc}")
        pytest.skip(f"no ROS 2 here: {exc}")
    return rclpy, msg, srv
