"""Launch the HeiSD graph: policy + retrieval + (sim or PIPER driver) + optional rviz2.

Examples::

    ros2 launch heisd_ros piper_heisd.launch.py                       # MuJoCo sim, heisd
    ros2 launch heisd_ros piper_heisd.launch.py sim:=false can_port:=can0 \
        model:=/path/small_vla.safetensors db:=/path/heisd_db task:=red_block_on_plate
    ros2 launch heisd_ros piper_heisd.launch.py method:=ar rviz:=true  # AR baseline
    ros2 launch heisd_ros piper_heisd.launch.py auto_reset:=false     # one episode per ~/reset
    ros2 launch heisd_ros piper_heisd.launch.py time_scale:=0.5       # the world at half speed
    ros2 launch heisd_ros piper_heisd.launch.py sim_mode:=lockstep    # one sim step per command
    ros2 launch heisd_ros piper_heisd.launch.py sim:=false model_type:=openvla \
        checkpoint:=/path/openvla-7b-finetuned-libero-spatial unnorm_key:=libero_spatial \
        center_crop:=true drafter:=/path/draft_head.safetensors db:=/path/heisd_db
    ros2 launch heisd_ros piper_heisd.launch.py discovery_range:=SUBNET  # cameras elsewhere
    ros2 launch heisd_ros piper_heisd.launch.py sim:=false security:=true \
        keystore:=/etc/heisd/keystore                               # SROS2, one enclave a node

``db`` is the directory ``heisd-build-db`` (and ``heisd-calibrate``) wrote: the retrieval
node serves it and the policy reads the router statistics of the task's suite and the
verify-skip calibration from it. Without them a router method (``heisd``, ``router_*``) runs
as drafter SD and every HybridStep status says why.

The nodes, their config files and remappings, and how the arguments become parameters come
from ``heisd_ros.nodes.graph`` — the same table ``heisd-bringup`` reads, so the two cannot
drift. So do the rules for stopping: every argument (including whether rviz2 is installed,
for ``rviz:=true``) is checked before the first node starts, and when a required node exits
or dies the launch shuts the others down and ends with exit code 1, printing why
(``graph.stop_reason``; rviz2 is optional).
When ``robot_state_publisher`` is installed it is started too, with the PIPER's URDF as
``robot_description`` and reading ``/joint_states`` (``heisd_ros.nodes.robot_description``),
so rviz2 shows the arm; without it the launch logs one line saying how to install it and goes
on (it is optional, like rviz2).
Every process (our nodes, robot_state_publisher, rviz2) gets the same environment
(``heisd_ros.nodes.graph_env``): discovery on this computer only unless ``discovery_range``
widens it, and with ``security:=true`` the SROS2 variables and its own enclave
``<enclave_root>/<name>``; a bad value stops the launch before the first node.
``launch``/``launch_ros`` are imported inside the functions only (machines without a ROS 2
distribution cannot install them; the table stays testable).
"""

from heisd_ros.nodes.graph import (
    ARGUMENT_HELP,
    LAUNCH_ARGUMENTS,
    PACKAGE,
    RVIZ_CONFIG,
    RVIZ_EXECUTABLE,
    RVIZ_PACKAGE,
    config_dir,
    exit_description,
    launch_overrides,
    nodes_for,
    parse_bool,
    rviz_problem,
    stop_reason,
)
from heisd_ros.nodes.graph_env import enclave_arguments, process_environment
from heisd_ros.nodes.robot_description import viewer_nodes


class RequiredNodeExited(RuntimeError):
    """A required node ended while the graph ran (the message is the reason)."""


def _on_exit(name):
    """``on_exit`` of program ``name``: end the launch, failing, if the graph needs it.

    Raising is how a launch file makes ``ros2 launch`` fail: launch's ``LaunchService`` logs
    "Caught exception in launch (see debug for traceback): <reason>", shuts every other
    process down and returns 1, the exit code of ``ros2 launch``. A node that ends while the
    launch is already shutting down (Ctrl-C, or after another node's end) raises nothing, so
    Ctrl-C still ends with 0 and the reason is printed once.
    """

    def on_exit(event, context):
        reason = stop_reason(name, exit_description(event.returncode))
        if reason and not getattr(context, "is_shutdown", False):
            raise RequiredNodeExited(reason)
        return None

    return on_exit


def _nodes(context):
    """The node actions for the argument values of this launch (an OpaqueFunction)."""
    from launch.actions import LogInfo
    from launch.substitutions import LaunchConfiguration
    from launch_ros.actions import Node

    values = {name: LaunchConfiguration(name).perform(context) for name in LAUNCH_ARGUMENTS}
    # Everything that can refuse the launch is checked before the first node is created.
    sim = parse_bool(values["sim"], "sim")
    overrides = launch_overrides(values, sim)
    specs = nodes_for(sim)
    rviz = parse_bool(values["rviz"], "rviz")
    problem = rviz_problem() if rviz else ""
    if problem:
        raise RuntimeError(problem)
    env = process_environment(values)
    configs = config_dir()
    actions = []
    for spec in specs:
        actions.append(Node(
            package=PACKAGE, executable=spec.executable, name=spec.name, output="screen",
            parameters=[str(configs / spec.config), overrides.get(spec.name, {})],
            remappings=list(spec.remappings), on_exit=_on_exit(spec.name),
            additional_env=env, arguments=enclave_arguments(values, spec.name)))
    viewers, note = viewer_nodes()
    if note:
        actions.append(LogInfo(msg=note))
    for viewer in viewers:
        actions.append(Node(package=viewer.package, executable=viewer.executable,
                            name=viewer.name, output="screen", parameters=[viewer.parameters],
                            remappings=list(viewer.remappings), on_exit=_on_exit(viewer.name),
                            additional_env=env,
                            arguments=enclave_arguments(values, viewer.name)))
    if rviz:
        actions.append(Node(package=RVIZ_PACKAGE, executable=RVIZ_EXECUTABLE,
                            name=RVIZ_EXECUTABLE, output="screen",
                            arguments=["-d", str(configs / RVIZ_CONFIG),
                                       *enclave_arguments(values, RVIZ_EXECUTABLE)],
                            additional_env=env, on_exit=_on_exit(RVIZ_EXECUTABLE)))
    return actions


def generate_launch_description():
    """The launch description (arguments from the shared table, nodes per their values)."""
    from launch.actions import DeclareLaunchArgument, OpaqueFunction

    from launch import LaunchDescription

    arguments = [DeclareLaunchArgument(name, default_value=default,
                                       description=ARGUMENT_HELP[name])
                 for name, default in LAUNCH_ARGUMENTS.items()]
    return LaunchDescription([*arguments, OpaqueFunction(function=_nodes)])
