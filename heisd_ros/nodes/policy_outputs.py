"""What the policy node publishes: the EE command, the step's status and viz, diagnostics.

A step's command goes out as soon as the decoder is done; its HybridStep, the executed path
and the router markers (with the path coloured by router mode) follow while the next
observation decodes (:mod:`heisd_ros.nodes.policy_step_loop`), so the decoder does not wait
for them.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from builtin_interfaces.msg import Time
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from nav_msgs.msg import Path
from rclpy.node import Node
from visualization_msgs.msg import MarkerArray

from heisd_ros.decoding.interface import ROUTER_OFF
from heisd_ros.msg import EECommand, HybridStep
from heisd_ros.nodes.policy_config import PolicyNodeConfig
from heisd_ros.nodes.policy_decoders import DecodedStep
from heisd_ros.nodes.policy_inputs import RobotInput, Snapshot
from heisd_ros.nodes.policy_messages import command_msg, hybrid_step_msg, robot_pose_msg
from heisd_ros.nodes.policy_viz import RouterPath, append_pose, step_markers
from heisd_ros.nodes.robot_msgs import seconds_to_stamp


class PolicyOutputs:
    """The policy node's publishers, and the executed path of the current episode.

    The path is kept twice, bounded by ``path_length`` both times: as the nav_msgs/Path of
    /heisd/ee_path and as the router-mode strip of /heisd/router_markers.
    """

    def __init__(self, node: Node, config: PolicyNodeConfig) -> None:
        """Create the publishers on ``node``; ``config`` gives frame and history lengths."""
        self.config = config
        self.path = Path()
        self.router_path = RouterPath(config.path_length)
        self._clock = node.get_clock()
        self._cmd_pub = node.create_publisher(EECommand, "/heisd/ee_command", 10)
        self._step_pub = node.create_publisher(HybridStep, "/heisd/hybrid_step", 10)
        self._path_pub = node.create_publisher(Path, "/heisd/ee_path", 1)
        self._marker_pub = node.create_publisher(MarkerArray, "/heisd/router_markers", 10)
        self._diag_pub = node.create_publisher(DiagnosticArray, "/diagnostics", 10)

    def command(self, step: DecodedStep, step_index: int, snap: Snapshot, task: str,
                retrieval_available: bool | None) -> Callable[[], None]:
        """Send the step's command now, stamped with its frames'; return its viz for later.

        The returned call publishes the step's HybridStep, path and markers (:meth:`step_viz`).
        """
        cfg, stamp = self.config, seconds_to_stamp(snap.stamp_s)
        self._cmd_pub.publish(command_msg(step, step_index, stamp, cfg.frame_id))
        return partial(self.step_viz, step, step_index, stamp, snap.robot, task,
                       retrieval_available)

    def step_viz(self, step: DecodedStep, step_index: int, stamp: Time, robot: RobotInput,
                 task: str, retrieval_available: bool | None) -> None:
        """HybridStep, the executed path and the router markers of a step that was sent."""
        cfg = self.config
        self._step_pub.publish(hybrid_step_msg(step, step_index, stamp, cfg.frame_id, task,
                                               retrieval_available))
        self._path_pub.publish(append_pose(self.path, robot_pose_msg(robot, stamp, cfg.frame_id),
                                           cfg.path_length))
        markers = step_markers(step_index, stamp, cfg.frame_id, robot.ee_position_m,
                               step.source, step.fields, cfg.marker_keep)
        markers.markers.append(self.router_path.add(
            robot.ee_position_m, step.fields.get("router_mode", ROUTER_OFF), stamp,
            cfg.frame_id))
        self._marker_pub.publish(markers)

    def new_episode(self) -> None:
        """Start a new executed path (and router-mode strip)."""
        self.path = Path()
        self.router_path = RouterPath(self.config.path_length)

    def diagnostics(self, status: DiagnosticStatus) -> None:
        """Publish ``status`` on /diagnostics, stamped now."""
        msg = DiagnosticArray(status=[status])
        msg.header.stamp = self._clock.now().to_msg()
        self._diag_pub.publish(msg)
