"""Only the commander moves the arm: the PIPER driver over real DDS against the emulated arm.

The driver runs in this process as in ``test_driver_command_stream`` (``driver_rig``: emulated
PIPER on python-can's virtual bus, a CAN tap); its commander is the rig's peer node. Other
nodes in the peer's context publish valid EE commands too. What reached the arm is read from
the emulator (its EE target) and the CAN frames the driver sent; what the driver says, from
its /diagnostics topic.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from test.ros_env import require_ros

rclpy, hmsg, hsrv = require_ros()

from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402

from heisd_ros.nodes.robot_msgs import ee_command_to_msg  # noqa: E402
from heisd_ros.robot.base import EECommand  # noqa: E402
from test.polling import wait_until  # noqa: E402
from test.test_driver_command_stream import Commander  # noqa: E402
from test.test_node_driver_can_frames import (  # noqa: E402
    PoseFrame,
    Rig,
    controller_values,
    decode,
    driver_rig,
)

pytestmark = pytest.mark.filterwarnings(
    "ignore:The 'bustype' argument is deprecated:DeprecationWarning"
)

TIMEOUT_S = 20.0
COMMAND_TOPIC = "/heisd/ee_command"


class Peers:
    """Extra nodes in the rig's peer context, spun on a thread: publishers, a listener, a client."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        self.context = rig.peer.context
        self.prefix = rig.pub.topic_name[: -len(COMMAND_TOPIC)]
        self.executor = SingleThreadedExecutor(context=self.context)
        self.nodes = []
        self.diagnostics: list[DiagnosticArray] = []
        listener = self.node("commander_test_listener")
        listener.create_subscription(DiagnosticArray, f"{self.prefix}/diagnostics",
                                     self.diagnostics.append, 10)
        self.clients = {name: listener.create_client(
            hsrv.ClaimControl, f"/{rig.node.get_name()}/{name}")
            for name in ("claim_control", "release_control")}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        while not self._stop.is_set():
            self.executor.spin_once(timeout_sec=0.05)

    def node(self, name: str):
        node = rclpy.create_node(name, context=self.context)
        self.executor.add_node(node)
        self.nodes.append(node)
        return node

    def remove(self, node) -> None:
        """Destroy ``node`` (its publisher leaves the ROS graph)."""
        self.executor.remove_node(node)
        self.nodes.remove(node)
        node.destroy_node()

    def publisher(self, node):
        pub = node.create_publisher(hmsg.EECommand, self.rig.pub.topic_name, 10)
        assert wait_until(lambda: pub.get_subscription_count() > 0, TIMEOUT_S)
        return pub

    def stream(self, node, pub, dp, rate_hz: float):
        """Publish ``dp`` steps at ``rate_hz`` from ``node``'s timer; returns the counter."""
        sent = {"n": 0}

        def publish() -> None:
            sent["n"] += 1
            pub.publish(command(self.rig, sent["n"], dp))

        node.create_timer(1.0 / rate_hz, publish)
        return sent

    def call(self, name: str, node_name: str):
        client = self.clients[name]
        assert client.wait_for_service(timeout_sec=TIMEOUT_S)
        future = client.call_async(hsrv.ClaimControl.Request(node_name=node_name))
        assert wait_until(future.done, TIMEOUT_S)
        return future.result()

    def refused_on_diagnostics(self, sender: str) -> int:
        """The newest /diagnostics count of commands refused from ``sender``."""
        name = f"{self.rig.node.get_name()}: controller"
        for array in reversed(list(self.diagnostics)):
            for status in array.status:
                if status.name == name:
                    values = {kv.key: kv.value for kv in status.values}
                    return json.loads(values["refused_publishers"]).get(sender, 0)
        return 0

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for node in list(self.nodes):
            self.remove(node)
        self.executor.shutdown()


@contextmanager
def peers(rig: Rig) -> Iterator[Peers]:
    extra = Peers(rig)
    try:
        yield extra
    finally:
        extra.close()


def command(rig: Rig, step: int, dp) -> object:
    """A valid EE delta command, stamped now (as the policy stamps its observation time)."""
    return ee_command_to_msg(EECommand(dp, (0.0, 0.0, 0.0), step_index=step,
                                       frame_id="base_link", stamp_s=rig.now_s() - 0.05))


def test_a_second_node_at_10_hz_moves_nothing_while_the_commanders_commands_act(capfd):
    with driver_rig("one-commander") as rig, peers(rig) as extra:
        cmd = Commander(rig)
        start = cmd.position()
        mark = rig.tap.count()
        spoofer = extra.node("spoofer")
        sent = extra.stream(spoofer, extra.publisher(spoofer), (0.0, 0.0, -0.01), 10.0)
        assert wait_until(lambda: extra.refused_on_diagnostics("/spoofer") >= 5, TIMEOUT_S), (
            controller_values(rig.node))
        assert cmd.value("commands_executed") == "0"
        # Nothing reached the arm: no pose frame on the bus, the arm where it was.
        assert not [e for e in decode(rig.tap.commands(mark), partial=True)
                    if isinstance(e, PoseFrame)]
        assert np.allclose(cmd.position(), start, rtol=0, atol=2e-6)
        # The commander's own commands still act, the spoofer streaming on.
        for step in (1, 2, 3):
            cmd.send(step, (0.01, 0.0, 0.0))
            cmd.settle(start + [0.01 * step, 0.0, 0.0])  # x moves; z (the spoofer's) does not
        values = controller_values(rig.node)
        assert values["commands_executed"] == "3"
        assert values["commander"] == "/one_commander_commander"
        assert values["commander_bound"] == "True"
        refused = json.loads(values["refused_publishers"])
        assert set(refused) == {"/spoofer"} and refused["/spoofer"] >= 5
        assert int(values["commands_foreign"]) == refused["/spoofer"] <= sent["n"]
        before = refused["/spoofer"]
        assert wait_until(lambda: extra.refused_on_diagnostics("/spoofer") > before, TIMEOUT_S)
        assert rig.node.controller_diagnostic().message.startswith("EE commands refused from")
    log = capfd.readouterr().err
    assert log.count("EECommand from /spoofer refused") == 1, log[-3000:]  # once per node


def test_claim_hands_control_to_a_tool_and_release_hands_it_back():
    with driver_rig("claims") as rig, peers(rig) as extra:
        cmd = Commander(rig)
        start = cmd.position()
        teleop = extra.node("teleop")
        teleop_pub = extra.publisher(teleop)
        teleop_pub.publish(command(rig, 1, (0.01, 0.0, 0.0)))
        assert wait_until(lambda: extra.refused_on_diagnostics("/teleop") == 1, TIMEOUT_S)

        reply = extra.call("claim_control", "teleop")  # relative: in the driver's namespace
        assert reply.success and reply.commander == "/teleop", reply.message
        assert controller_values(rig.node)["commander_event"] == (
            "claimed by /teleop (from /claims_commander)")
        for step in (2, 3):
            teleop_pub.publish(command(rig, step, (0.01, 0.0, 0.0)))
            cmd.settle(start + [0.01 * (step - 1), 0.0, 0.0])
        # The former commander is refused now, like anyone else.
        rig.pub.publish(command(rig, 1, (0.0, 0.01, 0.0)))
        assert wait_until(lambda: extra.refused_on_diagnostics("/claims_commander") == 1,
                          TIMEOUT_S)

        assert not extra.call("release_control", "/claims_commander").success  # not its claim
        reply = extra.call("release_control", "/teleop")
        assert reply.success and reply.commander == "/claims_commander", reply.message
        cmd.base, cmd.sent = int(cmd.value("commands_executed")), 0
        cmd.send(1, (0.0, 0.0, 0.01))  # starts over: re-anchored to the arm, executed
        cmd.settle(start + [0.02, 0.0, 0.01])
        assert cmd.value("commands_executed") == "3"


def test_claims_are_refused_when_the_configuration_locks_the_commander():
    with driver_rig("locked", **{"commander.allow_claim": False}) as rig, peers(rig) as extra:
        reply = extra.call("claim_control", "/teleop")
        assert not reply.success and "allow_claim" in reply.message
        assert reply.commander == "/locked_commander"


def test_losing_the_commander_holds_the_arm_at_once():
    # Slow released motion (4 mm/s: a 2 cm step takes 5 s) and a watchdog that would wait
    # 30 s: whatever stops the target early is the commander's loss, not the watchdog.
    with driver_rig("lost", **{"commander.node_name": "/short_lived",
                               "safety.max_linear_speed_m_s": 0.004,
                               "safety.watchdog_timeout_s": 30.0}) as rig, \
            peers(rig) as extra:
        cmd = Commander(rig)
        start = cmd.position()
        policy = extra.node("short_lived")
        pub = extra.publisher(policy)
        pub.publish(command(rig, 1, (0.02, 0.0, 0.0)))
        assert wait_until(lambda: cmd.value("commands_executed") == "1", TIMEOUT_S)
        assert cmd.value("commander_bound") == "True"
        extra.remove(policy)  # the commander's process ends: its publisher leaves the graph
        assert wait_until(lambda: "left the ROS graph" in cmd.value("commander_event"),
                          TIMEOUT_S), controller_values(rig.node)
        assert cmd.value("commander_bound") == "False"
        held = cmd.target()
        assert held[0] - start[0] < 0.015, held - start  # stopped well short of the 2 cm
        # Four more diagnostics (>= 2 s at 0.5 s: the released motion would have gone on
        # another 8 mm): the target stayed, the arm settled there, the watchdog never fired.
        seen = len(extra.diagnostics)
        assert wait_until(lambda: len(extra.diagnostics) >= seen + 4, TIMEOUT_S)
        cmd.settle(held)
        assert cmd.value("status") == "running"
        # A restarted commander (same node name, a new publisher) binds again and acts.
        policy = extra.node("short_lived")
        pub = extra.publisher(policy)
        pub.publish(command(rig, 0, (0.0, 0.0, 0.0)))  # starts over: re-anchored, executed
        assert wait_until(lambda: cmd.value("commands_executed") == "2", TIMEOUT_S)
        assert cmd.value("commander_bound") == "True"
