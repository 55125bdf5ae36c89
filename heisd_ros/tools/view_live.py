"""``heisd-view live``: the running graph, through the graph tools' :class:`GraphListener`.

The listener (on a node and thread of its own) hands every arrival to :meth:`LiveView.tap`,
which only queues it; :meth:`LiveView.pump` (the caller's thread) turns each HybridStep into a
logged step: the joint state last received before it, the camera frames with the step's header stamp
(the frames it was decided on), the age of the command with that stamp, and the step's fields.
A new episode (``/heisd/episode_status``) starts a new path. Memory stays bounded: frames and
commands are kept for the last :data:`PAIR_WINDOW` arrivals, the path for the newest
``path_keep`` steps.
"""

from __future__ import annotations

import threading
from collections import deque

import numpy as np

from heisd_ros.tools.graph.listener import stamp_from_cdr, stamp_seconds
from heisd_ros.viewer.episode_log import EpisodeLog
from heisd_ros.viewer.sources import message_fields

#: Frames and commands kept per stream to pair with a step by header stamp.
PAIR_WINDOW = 30
#: A frame and a step further apart in header stamp than this are not one step, s.
PAIR_SKEW_S = 1e-3


class LiveView:
    """Turns the listener's arrivals into steps of an :class:`EpisodeLog`."""

    def __init__(self, log: EpisodeLog, gripper_joint: str = "gripper") -> None:
        from heisd_ros.robot.piper_kinematics import PiperKinematics

        self.log, self.gripper_joint = log, gripper_joint
        self._fk = PiperKinematics()
        self._lock = threading.Lock()
        self._steps: deque = deque()
        self._frames = {c: deque(maxlen=PAIR_WINDOW) for c in ("third_person", "wrist")}
        self._commands: deque[tuple[float, float]] = deque(maxlen=PAIR_WINDOW)
        self._state: bytes | None = None
        self._episode: tuple | None = None
        self.episodes = 0
        self.skipped: dict[str, int] = {}

    def tap(self, kind: str, arrival_s: float, msg) -> None:
        """GraphListener's ``tap``: queue what arrived (on the listener's thread)."""
        with self._lock:
            if kind == "step":   # with the joint state current when it arrived
                self._steps.append((msg, self._state))
            elif kind == "command":
                self._commands.append((stamp_seconds(msg.header.stamp), arrival_s))
            elif kind == "state":
                self._state = msg
            elif kind in self._frames:
                self._frames[kind].append((stamp_from_cdr(msg), msg))
            elif kind == "status":
                key = (msg.suite, msg.task, int(msg.episode), int(msg.seed))
                if key != self._episode:
                    self._episode = key
                    self._steps.append((None, key))

    def pump(self) -> int:
        """Log every queued step; returns how many were logged."""
        with self._lock:
            steps, self._steps = list(self._steps), deque()
            frames = {c: list(f) for c, f in self._frames.items()}
            commands = list(self._commands)
        logged = 0
        for msg, state in steps:
            if msg is None:   # a new episode (``state`` holds its key): a new path
                self.log.new_episode(" ".join(str(v) for v in state))
                self.episodes += 1
                continue
            if state is None:
                self.skipped["no joint state yet"] = self.skipped.get("no joint state yet", 0) + 1
                continue
            self._log_step(msg, state, frames, commands)
            logged += 1
        return logged

    def _log_step(self, msg, state: bytes, frames: dict, commands: list) -> None:
        from rclpy.serialization import deserialize_message
        from sensor_msgs.msg import Image, JointState

        from heisd_ros.data.bag_topics import joint_values
        from heisd_ros.data.rosbag_io import raw_to_rgb

        joints = deserialize_message(state, JointState)
        arm, gripper = joint_values(list(joints.name), list(joints.position), self.gripper_joint)
        stamp = stamp_seconds(msg.header.stamp)
        images = []
        for camera in ("third_person", "wrist"):
            near = [d for s, d in frames[camera] if abs(s - stamp) <= PAIR_SKEW_S]
            image = None
            if near:
                m = deserialize_message(near[-1], Image)
                image = raw_to_rgb(bytes(m.data), m.height, m.width, m.step, m.encoding)
            images.append(image)
        ages = [(arrival - s) * 1e3 for s, arrival in commands if abs(s - stamp) <= PAIR_SKEW_S]
        self.log.step(stamp, joints_rad=arm, gripper_m=gripper,
                      ee_position_m=self._fk.fk(np.asarray(arm))[:3, 3],
                      fields=message_fields(msg), images=tuple(images),
                      command_age_ms=ages[0] if ages else None)

