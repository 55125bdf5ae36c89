"""The driver's command input: ``/heisd/ee_command`` through the commander gate into the core.

The ROS side of the one-commander rule; the rule itself is :class:`CommanderGate`
(``driver_commander``, no rclpy). :class:`CommandInput` owns what the rule needs from ROS:

- the command subscription, whose callback takes the MessageInfo (the sending publisher's
  GID) where rclpy offers one and the message alone where it does not (Humble);
- the publishers on the command topic, looked up in the ROS graph when the gate asks and
  every ``COMMANDER_CHECK_PERIOD_S``, so a commander whose publisher left holds the arm at once;
- ``~/claim_control`` and ``~/release_control`` (heisd_ros/srv/ClaimControl);
- the log lines: a bound or lost commander, a hand-over, the first refusal per sending node,
  and once per node a missing publisher GID;
- messages whose publisher the ROS graph does not name yet (a ``pending`` verdict): kept per
  publisher in arrival order (at most the QoS depth) and decided again at every message and
  every check, refused after ``ATTRIBUTION_TIMEOUT_S``, so a new commander's first command
  waits for discovery instead of being refused; other publishers' messages do not wait on
  them. The core's age check still applies to them.

Accepted commands go to :meth:`DriverCore.command`; refused ones are counted in the
:class:`DriverReport` (``foreign``) and per sender in the gate (the diagnostics read both).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from rclpy.callback_groups import CallbackGroup
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

from heisd_ros.msg import EECommand as EECommandMsg
from heisd_ros.nodes import driver_commander as commander
from heisd_ros.nodes.driver_commander import CommanderGate, Endpoint
from heisd_ros.nodes.driver_core import DriverCore
from heisd_ros.nodes.driver_report import DriverReport
from heisd_ros.nodes.robot_msgs import ee_command_from_msg
from heisd_ros.srv import ClaimControl

__all__ = [
    "COMMANDER_CHECK_PERIOD_S",
    "COMMAND_QOS",
    "COMMAND_TOPIC",
    "CommandInput",
    "message_info_available",
    "publisher_gid",
]

COMMAND_TOPIC = "/heisd/ee_command"
#: /heisd/ee_command: every delta, in order (reliable); never an old command to a late joiner
#: (volatile); 10 = 0.5 s (max_command_age_s) at 20 Hz: deeper would only queue commands the
#: age check refuses, and an overflow shows as a step_index gap (refused, re-anchored).
COMMAND_QOS = QoSProfile(
    reliability=ReliabilityPolicy.RELIABLE,
    durability=DurabilityPolicy.VOLATILE,
    history=HistoryPolicy.KEEP_LAST,
    depth=10,
)
#: How often the commander's publisher is looked for in the ROS graph, s (a lost one: hold).
COMMANDER_CHECK_PERIOD_S = 0.1
#: Publishers whose messages may wait for the graph to name them at once; a further one
#: refuses the oldest's waiting messages.
MAX_PENDING_PUBLISHERS = 16


class CommandInput:
    """EE commands from the commander only; claim/release of control; hold on a lost commander.

    Every callback runs in ``callback_group``, the group that touches the controller, so a
    command, a hand-over and a hold never interleave.
    """

    def __init__(
        self,
        node: Node,
        gate: CommanderGate,
        core: DriverCore,
        report: DriverReport,
        *,
        callback_group: CallbackGroup,
        monotonic_s: Callable[[], float] = time.monotonic,
        publishers: Callable[[], list[Endpoint]] | None = None,
    ) -> None:
        """Subscribe to the command topic; create the services and the commander check.

        Args:
            node: creates the subscription, services and timer; its namespace resolves node
                names, its graph lists the topic's publishers, its logger gets the log lines.
            gate: the one-commander rule (the node's diagnostics read it too).
            core: executes accepted commands, refuses malformed ones, holds the arm.
            report: counts received and foreign commands.
            callback_group: the controller's group.
            monotonic_s: monotonic clock, s (how recent the last refusal is, how long a
                message waited for discovery).
            publishers: the command topic's publishers now (default: from ``node``'s graph).
        """
        self._node = node
        self._gate = gate
        self._core = core
        self._report = report
        self._monotonic_s = monotonic_s
        self._publishers = publishers or self._command_publishers
        self._log = node.get_logger()
        self._gid_missing_logged = False
        #: Per publisher GID, (message, first seen s) of the messages waiting for the graph to
        #: name their sender, in arrival order; other publishers' messages do not wait on them.
        self._pending: dict[bytes | None, deque[tuple[EECommandMsg, float]]] = {}
        with_gid = message_info_available()
        self.subscription = node.create_subscription(
            EECommandMsg,
            COMMAND_TOPIC,
            self._on_command if with_gid else self._on_command_without_info,
            COMMAND_QOS,
            callback_group=callback_group,
        )
        for name, answer in (
            ("~/claim_control", gate.claim),
            ("~/release_control", gate.release),
        ):
            node.create_service(
                ClaimControl, name, self._claim_handler(answer), callback_group=callback_group
            )
        node.create_timer(
            COMMANDER_CHECK_PERIOD_S, self._check_commander, callback_group=callback_group
        )

    def _on_command_without_info(self, msg: EECommandMsg) -> None:
        self._on_command(msg, None)

    def _on_command(self, msg: EECommandMsg, info: dict | None) -> None:
        self._report.counts["received"] += 1
        gid = publisher_gid(info)
        if gid is None and not self._gid_missing_logged:
            self._gid_missing_logged = True
            self._log.warning(
                "this rclpy passes no publisher GID with a message: EE commands run only while "
                f"{self._gate.commander} is the only node publishing on "
                f"{self.subscription.topic_name}"
            )
        waiting = self._pending.get(gid)
        if waiting is not None:   # behind this publisher's earlier messages
            waiting.append((msg, self._monotonic_s()))
            self._decide_pending()
            return
        verdict = self._gate.admit(gid, self._publishers, self._monotonic_s())
        if not verdict.pending:
            self._act(msg, verdict)
            return
        if len(self._pending) >= MAX_PENDING_PUBLISHERS:   # many new publishers at once
            oldest = next(iter(self._pending))
            for old, _ in self._pending.pop(oldest):
                self._act(old, self._gate.expire(self._monotonic_s()))
        self._pending[gid] = deque([(msg, self._monotonic_s())], maxlen=COMMAND_QOS.depth)

    def _decide_pending(self) -> None:
        """Decide each publisher's waiting messages in order, up to one still pending."""
        for gid in list(self._pending):
            waiting = self._pending[gid]
            while waiting:
                msg, seen_s = waiting[0]
                now_s = self._monotonic_s()
                verdict = self._gate.admit(gid, self._publishers, now_s)
                if verdict.pending:
                    if now_s - seen_s < commander.ATTRIBUTION_TIMEOUT_S:
                        break
                    verdict = self._gate.expire(now_s)
                waiting.popleft()
                self._act(msg, verdict)
            if not waiting:
                del self._pending[gid]

    def _act(self, msg: EECommandMsg, verdict) -> None:
        """Execute an accepted message, count and report a refused one."""
        if verdict.bound:
            self._log.info(f"commander: {self._gate.event}")
        if not verdict.accepted:
            self._report.counts["foreign"] += 1
            if verdict.first:
                self._log.warning(
                    f"EECommand from {verdict.sender} refused: {verdict.reason}; the arm "
                    "follows only its commander (further refusals from this node are counted "
                    "on /diagnostics, refused_publishers)"
                )
            return
        try:
            command = ee_command_from_msg(msg)
        except ValueError as exc:
            self._core.refuse(msg.step_index, f"malformed EECommand: {exc}")
            return
        self._core.command(command)

    def _command_publishers(self) -> list[Endpoint]:
        """The publishers on the (remapped) command topic, from the ROS graph."""
        return [
            Endpoint(commander.fully_qualified(i.node_namespace, i.node_name),
                     bytes(i.endpoint_gid))
            for i in self._node.get_publishers_info_by_topic(self.subscription.topic_name)
        ]

    def _check_commander(self) -> None:
        self._decide_pending()
        if self._gate.bound_gid is None:
            return  # nothing bound, nothing to lose (and no graph query)
        if self._gate.check(self._publishers()):
            self._log.warning(f"commander: {self._gate.event}")
            self._core.hold(f"{self._gate.commander} is gone")

    def _claim_handler(self, answer: Callable[[str], tuple[bool, str]]):
        """A ClaimControl callback: resolve the name, ``answer(name)``, hold on a change."""

        def handler(request: ClaimControl.Request, response: ClaimControl.Response):
            try:
                name = commander.resolve_node_name(request.node_name, self._node.get_namespace())
            except ValueError as exc:
                response.success, response.message = False, str(exc)
            else:
                response.success, response.message = answer(name)
            response.commander = self._gate.commander
            if response.success:
                self._log.warning(f"commander: {self._gate.event}")
                self._core.hold(f"control passed to {self._gate.commander}")
            return response

        return handler


def message_info_available() -> bool:
    """Whether this rclpy hands subscription callbacks a MessageInfo (rclpy >= 3.4: Iron on).

    Humble's rclpy 3.3 calls a callback with the message only; from 3.4 (Iron, Jazzy's 7.1) a
    callback taking two arguments also gets the MessageInfo (timestamps, sequence numbers);
    its ``publisher_gid`` came later (Kilted's 9.1 has it). Without one the commander rule
    falls back to the topic's publishers (``driver_commander``), logged once.
    """
    from rclpy.subscription import Subscription

    return hasattr(Subscription, "CallbackType")


def publisher_gid(info: dict | None) -> bytes | None:
    """The sending publisher's GID from a MessageInfo; None when this rclpy does not give it."""
    gid = (info or {}).get("publisher_gid")
    data = gid.get("data") if isinstance(gid, dict) else None
    return bytes(data) if data else None
