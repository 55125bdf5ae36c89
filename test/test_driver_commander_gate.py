"""The one-commander rule as a library (no rclpy): binding, refusals, loss, claims, fallback."""

from __future__ import annotations

import json

import pytest

from heisd_ros.nodes.driver_commander import (
    UNATTRIBUTED,
    UNKNOWN,
    CommanderConfig,
    CommanderGate,
    Endpoint,
    fully_qualified,
    resolve_node_name,
)

POLICY, SPOOF, TELEOP = (Endpoint("/policy_node", b"p" * 16), Endpoint("/spoofer", b"s" * 16),
                         Endpoint("/teleop", b"t" * 16))


def graph(*endpoints: Endpoint):
    return lambda: list(endpoints)


def test_the_commander_binds_by_gid_and_every_other_publisher_is_refused_and_counted():
    gate = CommanderGate("/policy_node")
    first = gate.admit(POLICY.gid, graph(POLICY, SPOOF), 0.0)
    assert first.accepted and first.bound and gate.bound_gid == POLICY.gid
    assert gate.admit(POLICY.gid, graph(), 0.0).accepted  # bound: no graph look-up needed
    refusals = [gate.admit(SPOOF.gid, graph(POLICY, SPOOF), 0.1) for _ in range(3)]
    assert not any(v.accepted for v in refusals)
    assert [v.first for v in refusals] == [True, False, False]  # logged once per node
    assert refusals[0].sender == "/spoofer" and "not the commander" in refusals[0].reason
    assert gate.refused == {"/spoofer": 3}
    assert json.loads(gate.values()["refused_publishers"]) == {"/spoofer": 3}
    assert "/spoofer" in gate.warning(1.0) and gate.warning(100.0) == ""
    # A publisher the graph does not know yet cannot be the commander.
    unknown = gate.admit(b"x" * 16, graph(POLICY), 0.2)
    assert unknown.pending and unknown.sender == UNKNOWN and not unknown.accepted
    assert gate.refused == {"/spoofer": 3}  # a pending message is not counted


def test_a_publisher_the_graph_does_not_name_yet_is_pending_until_named_or_expired():
    gate = CommanderGate("/policy_node")
    nameless = Endpoint("_NODE_NAMESPACE_UNKNOWN_/_NODE_NAME_UNKNOWN_", POLICY.gid)
    for endpoints in ((), (nameless,)):   # not listed yet, listed without its node
        verdict = gate.admit(POLICY.gid, graph(*endpoints), 0.0)
        assert verdict.pending and not verdict.accepted and gate.bound_gid is None
    assert gate.refused == {}
    # Once the graph names it, the same message binds the commander.
    assert gate.admit(POLICY.gid, graph(POLICY), 0.1).bound
    # One never named is refused as UNKNOWN when its time is up, counted and reported once.
    expired = gate.expire(2.0)
    assert not expired.accepted and expired.first and gate.refused == {UNKNOWN: 1}
    assert "did not name its publisher within 1 s" in expired.reason


def test_a_second_publisher_of_the_commander_name_is_refused_until_the_first_is_gone():
    gate = CommanderGate("/policy_node")
    twin = Endpoint("/policy_node", b"q" * 16)
    assert gate.admit(POLICY.gid, graph(POLICY, twin), 0.0).accepted
    verdict = gate.admit(twin.gid, graph(POLICY, twin), 0.0)
    assert not verdict.accepted and "second publisher" in verdict.reason
    # The bound publisher leaves: the gate unbinds (the node holds) and the next one binds.
    assert not gate.check([POLICY, twin]) and gate.check([twin]) and gate.bound_gid is None
    assert "left the ROS graph" in gate.event and not gate.check([twin])
    assert gate.admit(twin.gid, graph(twin), 1.0).bound


def test_claim_and_release_move_control_and_unbind():
    gate = CommanderGate("/policy_node")
    gate.admit(POLICY.gid, graph(POLICY), 0.0)
    ok, message = gate.claim("/teleop")
    assert ok and "/teleop commands the arm now" in message and gate.bound_gid is None
    assert not gate.admit(POLICY.gid, graph(POLICY, TELEOP), 0.0).accepted
    assert gate.admit(TELEOP.gid, graph(POLICY, TELEOP), 0.0).accepted
    assert gate.release("/spoofer") == (False, "/spoofer does not hold control (/teleop does)")
    ok, _ = gate.release("/teleop")
    assert ok and gate.commander == "/policy_node" and gate.bound_gid is None
    assert not gate.release("/policy_node")[0]  # nothing to release
    locked = CommanderGate("/policy_node", allow_claim=False)
    ok, message = locked.claim("/teleop")
    assert not ok and "allow_claim" in message and locked.commander == "/policy_node"


def test_without_publisher_gids_only_a_topic_of_the_commander_alone_is_trusted():
    gate = CommanderGate("/policy_node")
    verdict = gate.admit(None, graph(POLICY), 0.0)
    assert verdict.accepted and verdict.bound
    verdict = gate.admit(None, graph(POLICY, SPOOF), 0.0)
    assert not verdict.accepted and verdict.sender == UNATTRIBUTED and "/spoofer" in verdict.reason
    assert not gate.admit(None, graph(), 0.0).accepted
    assert gate.check([SPOOF])  # the commander's publisher left


def test_names_resolve_in_the_driver_namespace_and_bad_ones_are_refused():
    assert resolve_node_name("policy_node", "/") == "/policy_node"
    assert resolve_node_name("policy_node", "/robot1") == "/robot1/policy_node"
    assert resolve_node_name("/teleop", "/robot1") == "/teleop"
    assert fully_qualified("/", "policy_node") == "/policy_node"
    assert fully_qualified("/robot1", "policy_node") == "/robot1/policy_node"
    with pytest.raises(ValueError, match="not a node name"):
        resolve_node_name("bad name", "/")
    with pytest.raises(ValueError, match="node_name"):
        CommanderConfig(node_name="9lives")
    with pytest.raises(ValueError, match="allow_claim"):
        CommanderConfig(allow_claim="yes")
