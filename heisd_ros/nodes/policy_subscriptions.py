"""The policy node's subscriptions: camera frames converted as they come, the robot state taken.

Camera frames (sensor_msgs/Image, or CompressedImage on ``<topic>/compressed`` with
``image_transport: compressed``) are converted to RGB in their callbacks
(:func:`subscribe_cameras`); a frame that cannot be converted comes with the reason.

The robot state is taken, not spun: the PIPER driver publishes /joint_states and /ee_pose at
200 Hz, and an executor wake-up per message (rclpy's Python wait-set and dispatch work) kept
the policy's process busy and its step thread waiting for the GIL. The subscriptions sit on a
helper node (``<policy name>_robot_state``) that no executor spins; each step (and each
diagnostics tick) takes the newest message of each (:meth:`RobotStateTaker.take`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial

import numpy as np
from geometry_msgs.msg import PoseStamped
from rclpy.exceptions import InvalidHandle
from rclpy.node import Node
from sensor_msgs.msg import CompressedImage, Image, JointState

from heisd_ros.nodes.image_conversion import ImageConversionError, compressed_to_rgb, image_to_rgb
from heisd_ros.nodes.policy_config import PolicyNodeConfig
from heisd_ros.nodes.policy_inputs import RobotInput
from heisd_ros.nodes.policy_messages import robot_input
from heisd_ros.nodes.robot_msgs import stamp_to_seconds

#: on_frame(camera, stamp_s, RGB frame or None, why it is None).
OnFrame = Callable[[str, float, "np.ndarray | None", str], None]


def camera_topics(config: PolicyNodeConfig) -> dict[str, str]:
    """Camera name -> the topic subscribed for it (``/compressed`` with that transport)."""
    suffix = "" if config.image_transport == "raw" else "/compressed"
    return {"third_person": config.third_person_topic + suffix,
            "wrist": config.wrist_topic + suffix}


def subscribe_cameras(node: Node, config: PolicyNodeConfig, on_frame: OnFrame,
                      callback_group=None) -> None:
    """Subscribe ``node`` to both cameras; each frame goes to ``on_frame`` converted."""
    image_type = Image if config.image_transport == "raw" else CompressedImage
    for camera, topic in camera_topics(config).items():
        node.create_subscription(image_type, topic, partial(_convert, on_frame, camera), 2,
                                 callback_group=callback_group)


def _convert(on_frame: OnFrame, camera: str, msg: Image | CompressedImage) -> None:
    stamp = stamp_to_seconds(msg.header.stamp)
    try:
        rgb = image_to_rgb(msg) if isinstance(msg, Image) else compressed_to_rgb(msg)
        problem = ""
    except ImageConversionError as exc:
        rgb, problem = None, str(exc)
    on_frame(camera, stamp, rgb, problem)


class RobotStateTaker:
    """Takes the newest joint state and EE pose on demand and hands on the robot input."""

    def __init__(self, node: Node, on_state: Callable[[RobotInput | None, str], None],
                 heard: Callable[[str], None]) -> None:
        """Subscribe on a helper node of ``node`` (same namespace and context).

        Args:
            node: the policy node.
            on_state: gets (robot input, "") or (None, why the messages are unusable) each
                time a take brings a new message.
            heard: gets "joint_states" or "ee_pose" for each message taken.
        """
        self._node = Node(f"{node.get_name()}_robot_state", namespace=node.get_namespace(),
                          context=node.context, start_parameter_services=False)
        self._on_state = on_state
        self._heard = heard
        self._lock = threading.Lock()
        self._joint: JointState | None = None
        self._pose: PoseStamped | None = None
        self._subs = {
            "joint_states": self._node.create_subscription(
                JointState, "/joint_states", self._on_joint_state, 1),
            "ee_pose": self._node.create_subscription(
                PoseStamped, "/ee_pose", self._on_pose, 1),
        }

    def take(self) -> None:
        """Take the newest /joint_states and /ee_pose that arrived since the last take.

        The subscriptions keep only the newest message (depth 1); older ones are what the
        robot was, not what it is. With both taken, the robot input is rebuilt once.
        """
        with self._lock:
            new = False
            for sub in self._subs.values():
                taken = None
                try:
                    with sub.handle:
                        while (msg_info := sub.handle.take_message(sub.msg_type,
                                                                   sub.raw)) is not None:
                            taken = msg_info[0]
                except InvalidHandle:  # destroyed while shutting down
                    return
                if taken is not None:
                    sub.callback(taken)
                    new = True
            if new:
                self._update()

    def destroy(self) -> None:
        """Destroy the helper node (after any take under way)."""
        with self._lock:
            self._node.destroy_node()

    def _on_joint_state(self, msg: JointState) -> None:
        self._joint = msg
        self._heard("joint_states")

    def _on_pose(self, msg: PoseStamped) -> None:
        self._pose = msg
        self._heard("ee_pose")

    def _update(self) -> None:
        joint, pose = self._joint, self._pose
        if joint is None or pose is None:
            return
        self._on_state(*robot_input(joint, pose))
