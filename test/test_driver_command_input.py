"""The driver's command input with a real rclpy node: messages wait for discovery to name them.

The topic's publishers and the clock come in through the constructor, so the test decides
when the ROS graph "names" a publisher; the core is a recorder of what reached it.
"""

from __future__ import annotations

import pytest

from test.ros_env import require_ros

rclpy, hmsg, _ = require_ros()

from rclpy.callback_groups import MutuallyExclusiveCallbackGroup  # noqa: E402

from heisd_ros.nodes.driver_command_input import CommandInput  # noqa: E402
from heisd_ros.nodes.driver_commander import (  # noqa: E402
    ATTRIBUTION_TIMEOUT_S,
    UNKNOWN,
    CommanderGate,
    Endpoint,
)
from heisd_ros.nodes.driver_report import DriverReport  # noqa: E402

POLICY, SPOOF = Endpoint("/policy_node", b"p" * 16), Endpoint("/spoofer", b"s" * 16)
NAMELESS = Endpoint("_NODE_NAMESPACE_UNKNOWN_/_NODE_NAME_UNKNOWN_", POLICY.gid)


class Core:
    """What reached the arm: executed step indices, refusals, holds."""

    def __init__(self) -> None:
        self.executed, self.refused, self.holds = [], [], []

    def command(self, command) -> None:
        self.executed.append(command.step_index)

    def refuse(self, step_index, reason) -> None:
        self.refused.append((step_index, reason))

    def hold(self, reason) -> None:
        self.holds.append(reason)


@pytest.fixture
def rig(ros_domain):
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=ros_domain)
    node = rclpy.create_node("command_input_test", context=context)
    state = {"graph": [], "now": 0.0}
    gate, core, report = CommanderGate("/policy_node"), Core(), DriverReport()
    commands = CommandInput(node, gate, core, report,
                            callback_group=MutuallyExclusiveCallbackGroup(),
                            monotonic_s=lambda: state["now"],
                            publishers=lambda: list(state["graph"]))
    yield commands, gate, core, report, state
    node.destroy_node()
    rclpy.shutdown(context=context)


def _message(step: int):
    msg = hmsg.EECommand(step_index=step)
    msg.header.frame_id = "base_link"
    msg.header.stamp.sec = 1
    return msg


def _info(endpoint: Endpoint) -> dict:
    return {"publisher_gid": {"data": endpoint.gid}}


def test_the_commanders_first_commands_wait_for_discovery_then_run_in_order(rig):
    commands, gate, core, report, state = rig
    state["graph"] = [NAMELESS]          # discovered, its node not named yet
    commands._on_command(_message(1), _info(POLICY))
    state["graph"] = []                  # (a graph may list it later than its data comes)
    commands._on_command(_message(2), _info(POLICY))
    assert core.executed == [] and gate.refused == {} and report.counts["foreign"] == 0
    # Another publisher's messages do not wait behind the nameless one's.
    state["graph"] = [SPOOF]
    commands._on_command(_message(7), _info(SPOOF))
    assert gate.refused == {"/spoofer": 1} and core.executed == []
    # The graph names the commander: the next check runs both, in order, and binds it.
    state["graph"], state["now"] = [POLICY, SPOOF], 0.3
    commands._check_commander()
    assert core.executed == [1, 2] and gate.bound_gid == POLICY.gid
    commands._on_command(_message(3), _info(POLICY))
    assert core.executed == [1, 2, 3] and report.counts["received"] == 4


def test_a_publisher_never_named_is_refused_when_its_time_is_up(rig):
    commands, gate, core, report, state = rig
    commands._on_command(_message(1), _info(POLICY))
    state["now"] = ATTRIBUTION_TIMEOUT_S / 2
    commands._check_commander()
    assert core.executed == [] and gate.refused == {}
    state["now"] = ATTRIBUTION_TIMEOUT_S + 0.01
    commands._check_commander()
    assert core.executed == [] and gate.refused == {UNKNOWN: 1}
    assert report.counts["foreign"] == 1
