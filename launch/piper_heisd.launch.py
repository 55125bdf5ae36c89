"""Launch the HeiSD graph: policy + retrieval + (sim or PIPER driver) + optional rviz2.

Examples::

    ros2 launch heisd_ros piper_heisd.launch.py                       # MuJoCo sim, heisd
    ros2 launch heisd_ros piper_heisd.launch.py sim:=false can_port:=can0 \
        model:=/path/small_vla.safetensors db:=/path/heisd_db task:=red_block_on_plate
    ros2 launch heisd_ros piper_heisd.launch.py method:=ar rviz:=true  # AR baseline

``db`` is the directory ``heisd-build-db`` (and ``heisd-calibrate``) wrote: the retrieval
node serves it and the policy reads the router statistics of the task's suite and the
verify-skip calibration from it. Without them a router method (``heisd``, ``router_*``) runs
as drafter SD and every HybridStep status says why.

The nodes, their config files and remappings, and how the arguments become parameters come
from ``heisd_ros.nodes.graph`` — the same table ``heisd-bringup`` reads, so the two cannot
drift. ``launch``/``launch_ros`` are imported inside :func:`generate_launch_description` only
(machines without a ROS 2 distribution cannot install them; the table stays testable).
"""

from heisd_ros.nodes.graph import (
    ARGUMENT_HELP,
    LAUNCH_ARGUMENTS,
    PACKAGE,
    RVIZ_CONFIG,
    config_dir,
    launch_overrides,
    nodes_for,
    parse_bool,
)


def _nodes(context):
    """The node actions for the argument values of this launch (an OpaqueFunction)."""
    from launch.substitutions import LaunchConfiguration
    from launch_ros.actions import Node

    values = {name: LaunchConfiguration(name).perform(context) for name in LAUNCH_ARGUMENTS}
    overrides = launch_overrides(values)
    configs = config_dir()
    actions = []
    for spec in nodes_for(parse_bool(values["sim"], "sim")):
        actions.append(Node(
            package=PACKAGE, executable=spec.executable, name=spec.name, output="screen",
            parameters=[str(configs / spec.config), overrides.get(spec.name, {})],
            remappings=list(spec.remappings)))
    if parse_bool(values["rviz"], "rviz"):
        actions.append(Node(package="rviz2", executable="rviz2", name="rviz2", output="screen",
                            arguments=["-d", str(configs / RVIZ_CONFIG)]))
    return actions


def generate_launch_description():
    """The launch description (arguments from the shared table, nodes per their values)."""
    from launch.actions import DeclareLaunchArgument, OpaqueFunction

    from launch import LaunchDescription

    arguments = [DeclareLaunchArgument(name, default_value=default,
                                       description=ARGUMENT_HELP[name])
                 for name, default in LAUNCH_ARGUMENTS.items()]
    return LaunchDescription([*arguments, OpaqueFunction(function=_nodes)])
