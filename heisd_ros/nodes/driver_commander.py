"""Who may move the arm: one commander, bound by node name and publisher GID.

The PIPER driver executes ``/heisd/ee_command`` only from its *commander*: one node, named by
its fully qualified name (``commander.node_name``; default ``policy_node`` in the driver's
namespace, i.e. the launch's ``/policy_node``). :class:`CommanderGate` decides per message:

- The first message from a publisher of the commander node binds the gate to that publisher's
  GID; from then on only messages carrying that GID are executed.
- A message from any other publisher is refused (never executed; the commander's stream goes
  on), counted per sending node and reported once per node (``first``).
- A second publisher of the commander node (a duplicate node name) is refused while the bound
  one is still in the ROS graph.
- A publisher the ROS graph does not name yet (just discovered: its GID is not listed, or
  listed under rmw's ``_NODE_NAME_UNKNOWN_``) is neither accepted nor refused: the verdict is
  ``pending`` and the node asks again (every message and every check) for up to
  :data:`ATTRIBUTION_TIMEOUT_S`, then :meth:`CommanderGate.expire` refuses it as ``UNKNOWN``.
  A commander's first command therefore waits for discovery instead of being refused.
- When the bound publisher leaves the graph (:meth:`CommanderGate.check`: its process ended or
  it destroyed the publisher) the gate unbinds and the driver holds the arm at once; the next
  publisher of the commander node (a restarted policy) binds again.
- :meth:`CommanderGate.claim` hands control to another node (a teleoperation or replay tool),
  :meth:`CommanderGate.release` hands it back to the configured one; either unbinds, and the
  driver holds the arm until the new commander's first command.

Without publisher GIDs (an rclpy whose MessageInfo lacks ``publisher_gid``, or no MessageInfo
at all) a sender cannot be told apart: a message is then executed only while every publisher
on the topic belongs to the commander node, and refused (``UNATTRIBUTED``) while any other node
publishes there.

How this meets the watchdog (``safety.watchdog_timeout_s``): the watchdog counts *accepted*
commands only, so refused ones never keep the arm alive; a commander that falls silent is held
by the watchdog after its timeout, a commander whose publisher is gone is held at once (before
the timeout) and stays held (the watchdog then reports ``watchdog_hold``) until a commander's
command is executed again.

Pure Python (no rclpy): the node passes GIDs as bytes and the topic's publishers as
:class:`Endpoint` values.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

#: The sender of a message whose publisher is not (yet) in the ROS graph.
UNKNOWN = "<not in the ROS graph>"
#: The sender of a message that carries no publisher GID while other nodes publish too.
UNATTRIBUTED = "<unattributed>"
#: A refusal keeps the controller diagnostic at WARN for this long, s.
REFUSAL_REPORT_S = 5.0
#: The name the ROS graph gives a publisher whose node it has not learned yet
#: (rmw's ``_NODE_NAMESPACE_UNKNOWN_/_NODE_NAME_UNKNOWN_``), as a fragment.
GRAPH_UNKNOWN_NAME = "_NODE_NAME_UNKNOWN_"
#: How long a message may wait for the ROS graph to name its publisher before it is refused
#: as UNKNOWN, s: discovery names a new publisher within milliseconds on an idle computer,
#: within some 100 ms on a loaded one.
ATTRIBUTION_TIMEOUT_S = 1.0
_NODE_NAME = re.compile(r"^/?(?:[A-Za-z_][A-Za-z0-9_]*/)*[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class CommanderConfig:
    """Which node commands the arm (``commander.*`` parameters of the driver).

    Attributes:
        node_name: the node whose /heisd/ee_command publisher moves the arm; a relative name
            is in the driver's namespace (``policy_node`` = the launch's /policy_node).
        allow_claim: whether ~/claim_control may hand control to another node (a
            teleoperation or replay tool); false keeps it with node_name.
    """

    node_name: str = "policy_node"
    allow_claim: bool = True

    def __post_init__(self) -> None:
        if not _NODE_NAME.match(self.node_name):
            raise ValueError(
                f"node_name: expected a node name like 'policy_node' or '/ns/policy_node', "
                f"got {self.node_name!r}"
            )
        if not isinstance(self.allow_claim, bool):
            raise ValueError(f"allow_claim: expected true or false, got {self.allow_claim!r}")


def resolve_node_name(name: str, namespace: str) -> str:
    """``name`` fully qualified: absolute as is, relative in ``namespace``.

    Raises:
        ValueError: not a node name.
    """
    if not _NODE_NAME.match(name):
        raise ValueError(f"not a node name: {name!r}")
    if name.startswith("/"):
        return name
    return f"{namespace.rstrip('/')}/{name}"


def fully_qualified(namespace: str, name: str) -> str:
    """A node's fully qualified name from its namespace and name (as the ROS graph lists them)."""
    return f"{namespace.rstrip('/')}/{name}"


@dataclass(frozen=True)
class Endpoint:
    """One publisher on the command topic.

    Attributes:
        node: fully qualified name of its node.
        gid: its GID (the bytes of the middleware's publisher id).
    """

    node: str
    gid: bytes


@dataclass(frozen=True)
class Verdict:
    """What the gate decided about one message.

    Attributes:
        accepted: execute it (it came from the commander's bound publisher).
        sender: the sending node (``UNKNOWN``/``UNATTRIBUTED`` when it cannot be named).
        reason: why it was refused ("" when accepted).
        first: the first refusal of this sender (log it once).
        bound: this message bound the gate to the sender's publisher.
        pending: the ROS graph does not name the sender yet: ask again (not counted).
    """

    accepted: bool
    sender: str
    reason: str = ""
    first: bool = False
    bound: bool = False
    pending: bool = False


@dataclass
class CommanderGate:
    """The one-commander rule (module docstring); no rclpy, no clock of its own.

    Attributes:
        configured: the commander from the parameters (fully qualified).
        allow_claim: whether :meth:`claim` may hand control to another node.
        commander: the node that commands the arm now (fully qualified).
        bound_gid: the GID of the commander's publisher the gate is bound to (None: unbound).
        refused: refused messages per sending node.
        event: the last change of commander or binding, for diagnostics.
    """

    configured: str
    allow_claim: bool = True
    commander: str = ""
    bound_gid: bytes | None = None
    refused: dict[str, int] = field(default_factory=dict)
    event: str = ""
    _refused_at: float = field(default=-math.inf, repr=False)

    def __post_init__(self) -> None:
        self.commander = self.commander or self.configured

    def admit(
        self,
        gid: bytes | None,
        publishers: Callable[[], Sequence[Endpoint]],
        now_s: float,
    ) -> Verdict:
        """Whether the message from publisher ``gid`` may be executed.

        Args:
            gid: the sending publisher's GID; None when the middleware does not say.
            publishers: the command topic's publishers now (asked only when needed).
            now_s: monotonic s (how recent the last refusal is).
        """
        if gid is not None and gid == self.bound_gid:
            return Verdict(True, self.commander)
        endpoints = publishers()
        if gid is None:
            return self._admit_unattributed(endpoints, now_s)
        sender = next((e.node for e in endpoints if e.gid == gid), UNKNOWN)
        if sender == UNKNOWN or GRAPH_UNKNOWN_NAME in sender:
            return Verdict(False, UNKNOWN, "the ROS graph does not name its publisher yet",
                           pending=True)
        if sender != self.commander:
            return self._refuse(sender, f"{sender} is not the commander ({self.commander})", now_s)
        if self.bound_gid is not None and any(e.gid == self.bound_gid for e in endpoints):
            return self._refuse(
                f"{sender} (second publisher)",
                f"a second publisher of {sender} (two nodes of that name?); the commander is "
                "bound to the first",
                now_s,
            )
        self.bound_gid = gid
        self.event = f"bound to {sender}'s publisher {gid.hex()}"
        return Verdict(True, sender, bound=True)

    def expire(self, now_s: float) -> Verdict:
        """Refuse a pending message whose publisher the graph never named in time."""
        return self._refuse(UNKNOWN, f"the ROS graph did not name its publisher within "
                                     f"{ATTRIBUTION_TIMEOUT_S:g} s", now_s)

    def _admit_unattributed(self, endpoints: Sequence[Endpoint], now_s: float) -> Verdict:
        ours = [e for e in endpoints if e.node == self.commander]
        others = sorted({e.node for e in endpoints} - {self.commander})
        if others:
            return self._refuse(
                UNATTRIBUTED,
                f"no publisher GID with the message and other nodes publish too "
                f"({', '.join(others)}): not attributable to {self.commander}",
                now_s,
            )
        if not ours:
            return self._refuse(UNKNOWN, f"{self.commander} has no publisher in the graph", now_s)
        bound = self.bound_gid is None
        if bound:  # kept only to notice the commander leaving (check())
            self.bound_gid = ours[0].gid
            self.event = f"bound to {self.commander} (the topic's only publisher)"
        return Verdict(True, self.commander, bound=bound)

    def _refuse(self, sender: str, reason: str, now_s: float) -> Verdict:
        first = sender not in self.refused
        self.refused[sender] = self.refused.get(sender, 0) + 1
        self._refused_at = now_s
        return Verdict(False, sender, reason, first=first)

    def check(self, endpoints: Sequence[Endpoint]) -> bool:
        """Unbind when the bound publisher is not among ``endpoints``; True if it just left."""
        if self.bound_gid is None or any(e.gid == self.bound_gid for e in endpoints):
            return False
        self.bound_gid = None
        self.event = f"{self.commander}'s publisher left the ROS graph: holding"
        return True

    def claim(self, node: str) -> tuple[bool, str]:
        """Hand control to ``node`` (fully qualified); (success, message)."""
        if not self.allow_claim:
            return False, (
                f"claims are off (commander.allow_claim false): {self.commander} keeps control"
            )
        previous, self.commander, self.bound_gid = self.commander, node, None
        self.event = f"claimed by {node} (from {previous})"
        return True, (
            f"{node} commands the arm now (was {previous}); the arm holds until its first "
            "command"
        )

    def release(self, node: str) -> tuple[bool, str]:
        """``node`` hands control back to the configured commander; (success, message)."""
        if node != self.commander:
            return False, f"{node} does not hold control ({self.commander} does)"
        if node == self.configured:
            return False, f"{node} is the configured commander: nothing to release"
        self.commander, self.bound_gid = self.configured, None
        self.event = f"released by {node} (back to {self.configured})"
        return True, (
            f"{self.configured} commands the arm again; the arm holds until its first command"
        )

    def values(self) -> dict[str, object]:
        """The gate's state as diagnostic values."""
        return {
            "commander": self.commander,
            "commander_configured": self.configured,
            "commander_bound": self.bound_gid is not None,
            "commander_event": self.event,
            "refused_publishers": json.dumps(self.refused, sort_keys=True),
        }

    def warning(self, now_s: float) -> str:
        """A line for the diagnostic while refusals are recent ("" otherwise)."""
        if now_s - self._refused_at >= REFUSAL_REPORT_S:
            return ""
        names = ", ".join(sorted(self.refused))
        return f"EE commands refused from {names} (only {self.commander} commands the arm)"
