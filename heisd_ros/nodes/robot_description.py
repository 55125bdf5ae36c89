"""robot_state_publisher in the graph: the PIPER's URDF as ``/robot_description`` and its TF.

``launch/piper_heisd.launch.py`` starts ``robot_state_publisher`` beside the nodes of
:data:`heisd_ros.nodes.graph.NODES` when the ROS 2 package is installed (a ROS desktop has
it), with the URDF's text as its ``robot_description`` parameter. It reads ``/joint_states``,
where the PIPER driver and the sim publish ``joint1`` .. ``joint6`` and ``gripper``; the
URDF's finger joints mimic ``gripper``, so rviz2's RobotModel display shows the arm and its
fingers as they move. Without the package the launch logs one line that says how to install
it and goes on: nothing of the graph needs it. ``heisd-bringup`` (one process, heisd_ros's
nodes only) never starts it and prints the same kind of line.

Like rviz2 it is optional (:func:`heisd_ros.nodes.graph.is_required`): its end leaves the
graph running. Pure Python: no rclpy, no launch.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from heisd_ros.nodes.graph import (
    PACKAGE,
    ROBOT_STATE_PUBLISHER_EXECUTABLE,
    ROBOT_STATE_PUBLISHER_PACKAGE,
    ros_apt_package,
)

#: The URDF under the package's share directory (installed by CMakeLists.txt).
URDF_PATH = Path("urdf") / "piper.urdf"
#: robot_state_publisher subscribes to ``joint_states``; the arm's joints are on the absolute
#: topic whatever namespace the launch is given.
JOINT_STATES_REMAPPING = ("joint_states", "/joint_states")


@dataclass(frozen=True)
class ExternalNode:
    """A node of another ROS 2 package that the launch starts beside the graph's own."""

    package: str
    executable: str
    name: str
    parameters: dict[str, str] = field(default_factory=dict)
    remappings: tuple[tuple[str, str], ...] = ()


def robot_description(share_dir: str | Path | None = None) -> str:
    """The URDF text: ``<share>/urdf/piper.urdf`` of the installed package, else generated.

    ``share_dir`` defaults to heisd_ros's share directory in the ament index; without one (no
    ROS 2, or the package not installed) or without the file there, the text is
    :func:`heisd_ros.robot.piper_urdf.piper_urdf`'s, which the installed file was written from.
    """
    if share_dir is None:
        try:
            from ament_index_python.packages import get_package_share_directory

            share_dir = get_package_share_directory(PACKAGE)
        except (ImportError, LookupError):
            share_dir = None
    if share_dir is not None:
        path = Path(share_dir) / URDF_PATH
        if path.is_file():
            return path.read_text()
    from heisd_ros.robot.piper_urdf import piper_urdf

    return piper_urdf()


def robot_state_publisher_missing(find_prefix: Callable[[str], str] | None = None,
                                  distro: str | None = None) -> str:
    """The one line to log when robot_state_publisher is not installed; "" when it is.

    Args:
        find_prefix: package name -> install prefix, raising LookupError when it is not
            installed; default: ament_index's ``get_package_prefix``.
        distro: ROS 2 distribution for the install hint; default: ``$ROS_DISTRO``.
    """
    package = ros_apt_package(ROBOT_STATE_PUBLISHER_PACKAGE.replace("_", "-"), distro)
    line = (f"robot_state_publisher is not installed, so rviz2 shows no arm model "
            f"(apt install {package}); the graph starts without it")
    if find_prefix is None:
        try:
            from ament_index_python.packages import get_package_prefix as find_prefix
        except ImportError:
            return line
    try:
        prefix = Path(find_prefix(ROBOT_STATE_PUBLISHER_PACKAGE))
    except LookupError:
        return line
    executable = prefix / "lib" / ROBOT_STATE_PUBLISHER_PACKAGE / ROBOT_STATE_PUBLISHER_EXECUTABLE
    if not (executable.is_file() and os.access(executable, os.X_OK)):
        return line
    return ""


def viewer_nodes(find_prefix: Callable[[str], str] | None = None, distro: str | None = None,
                 share_dir: str | Path | None = None) -> tuple[tuple[ExternalNode, ...], str]:
    """The nodes the launch adds for viewers, and the line to log ("" = nothing to say).

    With robot_state_publisher installed: its node, ``robot_description`` set to
    :func:`robot_description`'s text and ``joint_states`` read from ``/joint_states``.
    Without it: no node and :func:`robot_state_publisher_missing`'s line. The arguments are
    those functions'.
    """
    missing = robot_state_publisher_missing(find_prefix, distro)
    if missing:
        return (), missing
    node = ExternalNode(ROBOT_STATE_PUBLISHER_PACKAGE, ROBOT_STATE_PUBLISHER_EXECUTABLE,
                        ROBOT_STATE_PUBLISHER_EXECUTABLE,
                        parameters={"robot_description": robot_description(share_dir)},
                        remappings=(JOINT_STATES_REMAPPING,))
    return (node,), ""


def bringup_skip_line(distro: str | None = None) -> str:
    """What heisd-bringup prints: it starts heisd_ros's nodes only, never robot_state_publisher."""
    package = ros_apt_package(ROBOT_STATE_PUBLISHER_PACKAGE.replace("_", "-"), distro)
    return (f"robot_state_publisher is not started by heisd-bringup, so rviz2 shows no arm "
            f"model; use ros2 launch heisd_ros piper_heisd.launch.py with it installed "
            f"(apt install {package})")
