"""The policy node on an OpenVLA checkpoint, in this process over real DDS.

The tiny random checkpoint in OpenVLA's real layout (``test/openvla_fixtures.py``) is given
to the node the way a user gives a real one: ``model.type: openvla``, ``model.checkpoint``,
``model.unnorm_key``, plus ``model.vision_specs`` (the tiny backbones' sizes) and the CPU
opt-in ``model.allow_cpu`` (this machine has no GPU; a CPU is refused without it, as the
last tests show).
"""

from __future__ import annotations

import math
import time

import pytest

from test.polling import spin_until
from test.ros_env import require_ros

rclpy, hmsg, _ = require_ros()

from rclpy.executors import MultiThreadedExecutor  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402

from heisd_ros.nodes.policy_node import PolicyNode  # noqa: E402
from test.openvla_fixtures import write_tiny_openvla, write_vision_specs  # noqa: E402
from test.test_node_policy import policy_peer, send  # noqa: E402

EECommand, HybridStep = hmsg.EECommand, hmsg.HybridStep
KEY = "libero_spatial"  # the checkpoint holds "libero_spatial_no_noops": OpenVLA's key rule
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("openvla")
    return write_tiny_openvla(root / "ckpt"), write_vision_specs(root / "vision_specs.json")


def openvla_parameters(checkpoint, **more) -> list:
    directory, specs = checkpoint
    values = {"model.type": "openvla", "model.checkpoint": str(directory),
              "model.unnorm_key": KEY, "model.vision_specs": str(specs),
              "model.allow_cpu": True, **more}
    return [Parameter(name, value=value) for name, value in values.items()]


@pytest.fixture(scope="module")
def graph(checkpoint, module_ros_domain):
    """An OpenVLA policy node + a test peer (publishes inputs, records outputs)."""
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=module_ros_domain)
    policy = PolicyNode("openvla_policy", context=context, parameter_overrides=openvla_parameters(
        checkpoint, **{"method": "drafter", "instruction": "put the red block on the plate",
                       "warn_throttle_s": 0.0, "diagnostics_period_s": 0.2,
                       "input.max_age_s": 5.0, "max_command_age_s": 5.0,
                       "input_timeout_s": 30.0}))
    peer, out, pubs = policy_peer(context, "openvla_test_peer")
    executor = MultiThreadedExecutor(num_threads=4, context=context)
    for node in (policy, peer):
        executor.add_node(node)
    assert spin_until(executor,
                      lambda: all(p.get_subscription_count() >= 1 for p in pubs.values()))
    yield policy, None, peer, pubs, executor, out
    executor.shutdown()
    for node in (policy, peer):
        node.destroy_node()
    rclpy.shutdown(context=context)


def test_the_node_starts_on_the_openvla_checkpoint_and_publishes_a_hybrid_step(graph,
                                                                               checkpoint):
    policy, _, _peer, _pubs, executor, out = graph
    assert policy.config_error == "" and policy.decoder is not None, policy.config_error
    assert policy.model_description.startswith(f"OpenVLA {checkpoint[0]}")
    assert "unnorm_key=libero_spatial_no_noops" in policy.model_description
    assert "float32" in policy.model_description  # on the CPU, by the opt-in
    cmds, refused = send(graph)
    assert not refused, policy.last_problem
    assert len(cmds) == 1
    cmd = cmds[0]
    # a draft-head step verified by OpenVLA: the gripper token is the target's own
    assert cmd.source in (EECommand.SOURCE_DRAFTER, EECommand.SOURCE_AR)
    assert cmd.gripper_from_target and cmd.gripper in (EECommand.GRIPPER_OPEN,
                                                       EECommand.GRIPPER_CLOSED)
    assert all(math.isfinite(v) for v in (cmd.translation_m.x, cmd.translation_m.y,
                                          cmd.translation_m.z, cmd.rotation_rad.z))
    assert spin_until(executor, lambda: out["step"]), "no HybridStep came"
    step = out["step"][-1]
    assert step.step_index == cmd.step_index and step.target_forwards >= 1
    assert step.router_mode == HybridStep.ROUTER_OFF and step.total_ms > 0
    assert all(0 <= b <= 255 for b in step.action_bins)


def test_an_openvla_target_on_the_cpu_is_refused_without_the_opt_in(graph, checkpoint):
    """device: cpu (or no CUDA) without model.allow_cpu: refused at once, no weight read."""
    policy = graph[0]
    # CPU time of this process, not wall time: a loaded machine makes the refusal wait for a
    # core, while loading 7B weights would cost seconds of CPU either way.
    started = time.process_time()
    node = PolicyNode("cpu_policy", context=policy.context, parameter_overrides=openvla_parameters(
        checkpoint, **{"model.allow_cpu": False, "model.device": "cpu"}))
    try:
        assert node.decoder is None
        assert node.config_error.startswith(
            "policy not configured: ValueError: OpenVLA on the CPU refused: device 'cpu' was "
            "asked for. A 7B OpenVLA takes seconds per action on a CPU")
        assert "model.allow_cpu: true (launch argument allow_cpu:=true)" in node.config_error
        assert node.model_description == ""  # nothing was loaded
    finally:
        node.destroy_node()
    assert time.process_time() - started < 10.0  # refused, not loading


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a CUDA device is present")
def test_without_a_gpu_the_default_device_is_refused_too(graph, checkpoint):
    policy = graph[0]
    node = PolicyNode("no_gpu_policy", context=policy.context, parameter_overrides=(
        openvla_parameters(checkpoint, **{"model.allow_cpu": False})))
    try:
        assert node.decoder is None
        assert "OpenVLA on the CPU refused: no CUDA device is available" in node.config_error
    finally:
        node.destroy_node()
