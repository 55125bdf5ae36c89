"""One listener of the policy graph's topics: every arrival recorded with its wall time.

:class:`GraphListener` subscribes a node to /heisd/ee_command, /heisd/hybrid_step and
/diagnostics, and on request to both cameras, /joint_states and /heisd/episode_status. It
keeps what arrived, in arrival order, as plain records (:class:`Command`, :class:`Step`,
:class:`Status`; camera frames and robot states as arrival times), so a tool measures a
window by the records' arrival times and a viewer can read the latest ones (``keep`` bounds
each record list for a listener that runs for long). Arrival times are ``time.time()`` (s,
the clock of the nodes' stamps and log lines).

The callbacks run on whichever thread spins the node: the caller's executor
(:class:`GraphListener` on the caller's node) or a thread of the listener's own
(:meth:`GraphListener.on_own_thread`). Records are only appended, so readers copy them
(``list(listener.commands)``); diagnostics are read through :meth:`diagnostics_snapshot`.

This module imports no ROS at import time: the records and :func:`stamp_from_cdr` are pure.
"""

from __future__ import annotations

import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

#: Camera names, in the order of the sim node's THIRD_PERSON_TOPIC / WRIST_TOPIC.
CAMERAS = ("third_person", "wrist")
#: The policy node's /diagnostics status with its counters and step times.
POLICY_DIAGNOSTICS = "policy_node: policy"
#: The driver's /diagnostics status with its command counters.
DRIVER_DIAGNOSTICS = "piper_driver_node: controller"
#: The sim node's (heisd_ros.nodes.sim_params.SIM_DIAGNOSTICS, spelled here so that this
#: module imports nothing of the nodes).
SIM_DIAGNOSTICS = "sim_node: commands"
#: HybridStep stage fields (ms) kept per step.
STAGES = ("vision_ms", "retrieval_ms", "prefill_ms", "draft_ms", "verify_ms", "overhead_ms",
          "total_ms")


@dataclass(frozen=True)
class Command:
    """One EECommand: when it arrived and its header stamp (the frames' time), s."""

    arrival_s: float
    stamp_s: float

    @property
    def age_s(self) -> float:
        """How old the frames it was decided on were when it arrived, s."""
        return self.arrival_s - self.stamp_s


@dataclass(frozen=True)
class Step:
    """One HybridStep as received (the fields the graph tools read).

    ``stamp_ns`` is the header stamp in integer ns (the frames' time); ``stages`` holds the
    :data:`STAGES` times, ms; ``behind_result``/``behind_wait_ms`` the check behind it
    collected (``heisd_behind``).
    """

    arrival_s: float
    stamp_ns: int
    total_ms: float
    verify_skipped: bool
    unverified_run: int
    status: str
    draft_source: int
    stages: dict = field(default_factory=dict)
    behind_result: int = 0
    behind_wait_ms: float = 0.0

    @property
    def unverified(self) -> bool:
        """Whether the step ran without the target VLA (skipped or in an unverified run)."""
        return self.verify_skipped or self.unverified_run > 0


@dataclass(frozen=True)
class Status:
    """One /heisd/episode_status as received: its stamp (s) and the fields that matter."""

    stamp_s: float
    key: tuple  # (suite, task, episode, seed): one episode
    step: int
    done: bool
    success: bool = False
    reason: str = ""


def stamp_from_cdr(data: bytes) -> float:
    """header.stamp, s, of a serialized message whose first field is a std_msgs/Header.

    After the 4-byte CDR encapsulation header come ``stamp.sec`` (int32) and
    ``stamp.nanosec`` (uint32), in the byte order the encapsulation names.
    """
    order = "<" if data[1] & 1 else ">"
    sec, nanosec = struct.unpack_from(order + "iI", data, 4)
    return sec + nanosec * 1e-9


def stamp_seconds(stamp) -> float:
    """A ``builtin_interfaces/Time`` in seconds.

    ``robot_msgs.stamp_to_seconds`` does the same but imports the message types, and this
    module must import without ROS.
    """
    return stamp.sec + stamp.nanosec * 1e-9


class GraphListener:
    """Subscriptions of one node to the graph's topics and what arrived on them.

    Attributes:
        commands: every EECommand (:class:`Command`).
        steps: every HybridStep (:class:`Step`).
        frames: per camera of :data:`CAMERAS`, (arrival s, header stamp s) of each image
            (with ``cameras``; taken serialized, the stamp read from the CDR bytes).
        states: arrival times of /joint_states, s (with ``robot_state``; serialized).
        statuses: every EpisodeStatus (:class:`Status`, with ``episodes``).
        diagnostics_at: per /diagnostics status name, when it last arrived, s.

    ``keep``: the newest records kept per list (None: all, what a measured window needs).
    ``tap``: called as ``tap(kind, arrival_s, message)`` with every arrival besides the
    record (kind: "command", "step", "status", "state", or a camera of :data:`CAMERAS`;
    the message as received: serialized bytes for cameras and joint states), for a viewer
    that needs the contents; on the spinning thread, so it must be quick.
    """

    def __init__(self, node, *, cameras: bool = False, robot_state: bool = False,
                 episodes: bool = False, keep: int | None = None,
                 clock: Callable[[], float] = time.time,
                 tap: Callable[[str, float, object], None] | None = None) -> None:
        from diagnostic_msgs.msg import DiagnosticArray

        from heisd_ros.msg import EECommand, HybridStep

        self.node, self._clock, self._tap = node, clock, tap
        self._lock = threading.Lock()
        self._executor = self._thread = None
        self.commands: deque[Command] = deque(maxlen=keep)
        self.steps: deque[Step] = deque(maxlen=keep)
        self.frames: dict[str, deque[tuple[float, float]]] = {
            c: deque(maxlen=keep) for c in CAMERAS}
        self.states: deque[float] = deque(maxlen=keep)
        self.statuses: deque[Status] = deque(maxlen=keep)
        self._diagnostics: dict[str, dict[str, str]] = {}
        self._levels: dict[str, int] = {}
        self.diagnostics_at: dict[str, float] = {}
        node.create_subscription(EECommand, "/heisd/ee_command", self.on_command, 100)
        node.create_subscription(HybridStep, "/heisd/hybrid_step", self.on_step, 100)
        node.create_subscription(DiagnosticArray, "/diagnostics", self.on_diagnostics, 50)
        if cameras:
            from sensor_msgs.msg import Image

            from heisd_ros.nodes.sim_node import THIRD_PERSON_TOPIC, WRIST_TOPIC

            # Images only for their times: taken serialized, the stamp read from CDR.
            for camera, topic in zip(CAMERAS, (THIRD_PERSON_TOPIC, WRIST_TOPIC), strict=True):
                node.create_subscription(Image, topic, self._frame_callback(camera), 10,
                                         raw=True)
        if robot_state:
            from sensor_msgs.msg import JointState

            node.create_subscription(JointState, "/joint_states", self.on_state, 50, raw=True)
        if episodes:
            from heisd_ros.msg import EpisodeStatus
            from heisd_ros.nodes.qos import STATUS_QOS

            node.create_subscription(EpisodeStatus, "/heisd/episode_status", self.on_status,
                                     STATUS_QOS)

    @classmethod
    def on_own_thread(cls, context, name: str, **topics) -> GraphListener:
        """A listener on a node of its own, spun by an executor thread until :meth:`close`."""
        import rclpy
        from rclpy.executors import SingleThreadedExecutor

        listener = cls(rclpy.create_node(name, context=context), **topics)
        listener._executor = SingleThreadedExecutor(context=context)
        listener._executor.add_node(listener.node)
        listener._thread = threading.Thread(target=listener._executor.spin, name=name,
                                            daemon=True)
        listener._thread.start()
        return listener

    def close(self) -> None:
        """Stop the own executor thread and destroy the node (a caller's node is left alone)."""
        if self._executor is None:
            return
        self._executor.shutdown()
        self._thread.join(timeout=5.0)
        self.node.destroy_node()
        self._executor = self._thread = None

    # ------------------------------------------------------------ callbacks
    def _tapped(self, kind: str, arrival_s: float, msg) -> None:
        if self._tap is not None:
            self._tap(kind, arrival_s, msg)

    def on_command(self, msg) -> None:
        """An EECommand arrived."""
        now = self._clock()
        self.commands.append(Command(now, stamp_seconds(msg.header.stamp)))
        self._tapped("command", now, msg)

    def on_step(self, msg) -> None:
        """A HybridStep arrived."""
        stamp, now = msg.header.stamp, self._clock()
        self.steps.append(Step(
            now, int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec),
            float(msg.total_ms), bool(msg.verify_skipped), int(msg.unverified_run),
            str(msg.status), int(msg.draft_source),
            {k: float(getattr(msg, k)) for k in STAGES},
            int(msg.behind_result), float(msg.behind_wait_ms)))
        self._tapped("step", now, msg)

    def on_diagnostics(self, msg) -> None:
        """A DiagnosticArray arrived: each status's values (and ``message``) replace the last."""
        now = self._clock()
        with self._lock:
            for status in msg.status:
                values = {kv.key: kv.value for kv in status.values}
                values["message"] = status.message
                self._diagnostics[status.name] = values
                level = status.level
                self._levels[status.name] = level if isinstance(level, int) else ord(level)
                self.diagnostics_at[status.name] = now

    def on_status(self, msg) -> None:
        """An EpisodeStatus arrived."""
        self.statuses.append(Status(stamp_seconds(msg.header.stamp),
                                    (msg.suite, msg.task, int(msg.episode), int(msg.seed)),
                                    int(msg.step), bool(msg.done), bool(msg.success),
                                    str(msg.reason)))
        self._tapped("status", self._clock(), msg)

    def on_state(self, data: bytes) -> None:
        """A /joint_states arrived (serialized: only its time counts)."""
        now = self._clock()
        self.states.append(now)
        self._tapped("state", now, data)

    def _frame_callback(self, camera: str) -> Callable[[bytes], None]:
        frames = self.frames[camera]

        def on_frame(data: bytes) -> None:
            now = self._clock()
            frames.append((now, stamp_from_cdr(data)))
            self._tapped(camera, now, data)
        return on_frame

    # ------------------------------------------------------------ reading
    def diagnostics_snapshot(self) -> dict[str, dict[str, str]]:
        """A copy of the latest values (and ``message``) of every /diagnostics status."""
        with self._lock:
            return {name: dict(values) for name, values in self._diagnostics.items()}

    def diagnostics_of(self, name: str) -> dict[str, str]:
        """A copy of the latest values of one status ({} before it arrived)."""
        with self._lock:
            return dict(self._diagnostics.get(name, {}))

    def diagnostic_levels(self) -> dict[str, int]:
        """The latest level of every /diagnostics status (0 OK, 1 WARN, 2 ERROR, 3 STALE)."""
        with self._lock:
            return dict(self._levels)

    def commands_between(self, start_s: float, end_s: float) -> list[Command]:
        """The commands that arrived in [start_s, end_s]."""
        return [c for c in list(self.commands) if start_s <= c.arrival_s <= end_s]

    def steps_between(self, start_s: float, end_s: float) -> list[Step]:
        """The HybridSteps that arrived in [start_s, end_s]."""
        return [s for s in list(self.steps) if start_s <= s.arrival_s <= end_s]
