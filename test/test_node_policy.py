"""The policy node in this process over real DDS: commands from good input, none from bad.

A tiny random small VLA and draft head (written to a temporary directory) keep it fast; what
is checked is the node's plumbing, not the policy's skill.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from test.polling import spin_for, spin_until
from test.ros_env import require_ros

rclpy, hmsg, hsrv = require_ros()

from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from geometry_msgs.msg import PoseStamped  # noqa: E402
from nav_msgs.msg import Path as PathMsg  # noqa: E402
from rclpy.executors import MultiThreadedExecutor  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from sensor_msgs.msg import Image, JointState  # noqa: E402
from visualization_msgs.msg import MarkerArray  # noqa: E402

from heisd_ros.nodes.image_conversion import rgb_to_image  # noqa: E402
from heisd_ros.nodes.policy_node import PolicyNode  # noqa: E402
from heisd_ros.nodes.policy_viz import PATH_MARKER_ID, PATH_NAMESPACE, ROUTER_COLOURS  # noqa: E402
from heisd_ros.nodes.robot_msgs import seconds_to_stamp, stamp_to_seconds  # noqa: E402

EECommand, HybridStep = hmsg.EECommand, hmsg.HybridStep
SIZE = 32


def tiny_models(directory: Path) -> tuple[str, str]:
    """(small-VLA path, draft-head path) of a tiny random model pair."""
    from heisd_ros.models.checkpoint import save_draft_head, save_small_vla
    from heisd_ros.models.draft_head import DraftHead, DraftHeadConfig
    from heisd_ros.models.small_vla import SmallVLA
    from heisd_ros.models.small_vla_config import SmallVLAConfig

    config = SmallVLAConfig(image_size_px=SIZE, patch_size_px=16, vision_dim=32, vision_heads=2,
                            hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128)
    target = SmallVLA.random(config, seed=1)
    vla = save_small_vla(target, directory / "tiny_vla.safetensors", dtype="float32")
    head = save_draft_head(DraftHead(DraftHeadConfig.for_target(target)),
                           directory / "tiny_head.safetensors", target)
    return str(vla), str(head)


@pytest.fixture(scope="module")
def graph(tmp_path_factory, module_ros_domain):
    """Policy node + a test peer (publishes inputs, records outputs) on a private domain."""
    vla, head = tiny_models(tmp_path_factory.mktemp("models"))
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=module_ros_domain)
    policy = PolicyNode(context=context, parameter_overrides=[
        Parameter("method", value="drafter"), Parameter("model.path", value=vla),
        Parameter("model.drafter_path", value=head), Parameter("instruction", value="pick it"),
        Parameter("warn_throttle_s", value=0.0), Parameter("diagnostics_period_s", value=0.2),
        # a loaded machine may take a few tenths of a second to a decode, or between the
        # state and the frames: the stale case is 3 s old, so a 2 s limit still tells it
        # apart from a slow good frame
        Parameter("input.max_age_s", value=2.0), Parameter("max_command_age_s", value=2.0),
        Parameter("input.max_state_skew_s", value=2.0),
        # the silent-input report has its own test, which lowers this for its duration
        Parameter("input_timeout_s", value=30.0)])
    broken = PolicyNode("broken_policy", context=context, parameter_overrides=[
        Parameter("model.path", value="/nonexistent/vla.safetensors")])
    peer, out, pubs = policy_peer(context, "policy_test_peer")
    executor = MultiThreadedExecutor(num_threads=4, context=context)
    for node in (policy, broken, peer):
        executor.add_node(node)
    assert spin_until(executor,
                      lambda: all(p.get_subscription_count() >= 2 for p in pubs.values()))
    yield policy, broken, peer, pubs, executor, out
    executor.shutdown()
    for node in (policy, broken, peer):
        node.destroy_node()
    rclpy.shutdown(context=context)


def policy_peer(context, name: str):
    """A node that feeds a policy (cameras, joint states, EE pose) and records what it sends.

    Returns (node, {kind: received messages}, {input: publisher}).
    """
    peer = rclpy.create_node(name, context=context)
    out = {"cmd": [], "step": [], "path": [], "markers": [], "diag": []}
    for key, msg_type, topic in (("cmd", EECommand, "/heisd/ee_command"),
                                 ("step", HybridStep, "/heisd/hybrid_step"),
                                 ("path", PathMsg, "/heisd/ee_path"),
                                 ("markers", MarkerArray, "/heisd/router_markers"),
                                 ("diag", DiagnosticArray, "/diagnostics")):
        peer.create_subscription(msg_type, topic, out[key].append, 10)
    pubs = {"third": peer.create_publisher(Image, "/camera/third_person/image_raw", 2),
            "wrist": peer.create_publisher(Image, "/camera/wrist/image_raw", 2),
            "joints": peer.create_publisher(JointState, "/joint_states", 10),
            "pose": peer.create_publisher(PoseStamped, "/ee_pose", 10)}
    return peer, out, pubs


def send(graph, *, third=None, wrist=None, joints=0.1, offset_s=0.0, encoding="rgb8",
         ee_x_m=0.3):
    """Publish a robot state, then both frames stamped (when sent) now + offset_s.

    ``encoding`` is the third-person camera's (the wrist sends rgb8). Spins until the
    policy sent a command or refused; returns (new commands, new refusals).
    """
    policy, _broken, peer, pubs, executor, out = graph
    rng = np.random.default_rng(len(out["cmd"]) + sum(policy.refusals.values()))
    now = peer.get_clock().now().nanoseconds * 1e-9
    joint = JointState(name=[f"joint{i}" for i in range(1, 7)] + ["gripper"],
                       position=[joints] * 6 + [0.07])
    pose = PoseStamped()
    pose.pose.position.x, pose.pose.position.z, pose.pose.orientation.w = ee_x_m, 0.3, 1.0
    joint.header.stamp = pose.header.stamp = seconds_to_stamp(now)
    pose.header.frame_id = "base_link"
    pubs["joints"].publish(joint)
    pubs["pose"].publish(pose)
    # The frames go out once the policy holds this state and has started any episode it was
    # asked to (a start drops the frames it holds).
    state_s = stamp_to_seconds(joint.header.stamp)
    assert spin_until(executor, lambda: policy.episodes.pending is None and (
        (robot := policy.gate._robot) is not None and robot.stamp_s == state_s)), \
        "the policy never took the robot state"
    cmds, refused = len(out["cmd"]), dict(policy.refusals)
    # the frames are stamped as they are sent (after the state: within the skew limit)
    stamp = seconds_to_stamp(peer.get_clock().now().nanoseconds * 1e-9 + offset_s)
    for key, image in (("third", third), ("wrist", wrist)):
        image = image if image is not None else rng.integers(0, 255, (SIZE, SIZE, 3), np.uint8)
        bad = encoding != "rgb8" and key == "third"  # the third-person camera misbehaves
        msg = _raw(image, encoding) if bad else rgb_to_image(image)
        msg.header.stamp, msg.header.frame_id = stamp, "base_link"
        pubs[key].publish(msg)
    assert spin_until(executor, lambda: len(out["cmd"]) > cmds or policy.refusals != refused), \
        "the policy neither sent a command nor refused"
    spin_for(executor, 0.15)  # a late second command would show here
    new_kinds = {k for k, n in policy.refusals.items() if n > refused.get(k, 0)}
    return out["cmd"][cmds:], new_kinds


def _raw(image, encoding):
    msg = Image(height=image.shape[0], width=image.shape[1], encoding=encoding,
                step=image.shape[1] * 4)
    msg.data = np.concatenate([image, np.full(image.shape[:2] + (1,), 255, np.uint8)],
                              axis=2).tobytes()
    return msg


def test_good_input_gives_one_command_with_its_status(graph):
    policy, _broken, _peer, _pubs, executor, out = graph
    cmds, refused = send(graph)
    assert not refused, policy.last_problem
    assert len(cmds) == 1
    cmd = cmds[0]
    assert cmd.source == EECommand.SOURCE_DRAFTER and cmd.gripper_from_target
    assert cmd.header.frame_id == "base_link" and cmd.mode == EECommand.MODE_DELTA
    assert all(math.isfinite(v) for v in (cmd.translation_m.x, cmd.rotation_rad.z))
    assert spin_until(executor, lambda: out["step"] and out["path"] and out["markers"])
    step = out["step"][-1]
    assert step.step_index == cmd.step_index and step.target_forwards >= 1
    assert step.router_mode == HybridStep.ROUTER_OFF and step.total_ms > 0
    assert out["path"][-1].poses and out["path"][-1].header.frame_id == "base_link"
    text = [m.text for m in out["markers"][-1].markers if m.text]
    assert text and "AL=" in text[0] and "F=" in text[0]
    # the same array holds the episode's path as a strip coloured by router mode (here off)
    strip = next(m for m in out["markers"][-1].markers if m.ns == PATH_NAMESPACE)
    assert strip.type == strip.LINE_STRIP and strip.id == PATH_MARKER_ID
    assert len(strip.colors) == len(strip.points)
    grey = ROUTER_COLOURS[HybridStep.ROUTER_OFF]
    assert all(math.isclose(value, want, abs_tol=1e-6) for c in strip.colors
               for value, want in zip((c.r, c.g, c.b), grey, strict=True))
    assert spin_until(executor, lambda: any(p.header.stamp == strip.header.stamp
                                            for p in out["path"]))
    poses = next(p.poses for p in out["path"] if p.header.stamp == strip.header.stamp)
    assert len(strip.points) == max(2, len(poses))  # one position is drawn twice


@pytest.mark.parametrize("case,kind", [
    (dict(encoding="rgba8"), "malformed third_person image"),
    (dict(wrist=np.zeros((16, 16, 3), np.uint8)), "mismatched image sizes"),
    (dict(joints=float("nan")), "NaN in the robot state"),
    (dict(offset_s=5.0), "frame from the future"),
    (dict(offset_s=-3.0), "stale frames"),
])
def test_bad_input_gives_a_named_warning_and_no_command(graph, capfd, case, kind):
    policy = graph[0]
    cmds, refused = send(graph, **case)
    assert cmds == []
    assert kind in refused, (refused, policy.last_problem)
    assert policy.last_problem.startswith(kind)
    assert f"holding, no command: {kind}" in capfd.readouterr().err
    cmds, refused = send(graph)  # and good input right after works again
    assert len(cmds) == 1 and not refused


def test_a_bad_model_path_fails_cleanly_with_the_reason(graph):
    policy, broken, _peer, _pubs, executor, out = graph
    assert broken.decoder is None
    assert "/nonexistent/vla.safetensors" in broken.config_error
    assert spin_until(executor, lambda: any(
        s.name == "broken_policy: policy" for d in out["diag"] for s in d.status))
    status = next(s for d in out["diag"] for s in d.status if s.name == "broken_policy: policy")
    assert status.level == status.ERROR and "nonexistent" in status.message
    assert policy.commands_sent == len(out["cmd"])  # every command came from the good node


def test_the_default_method_without_a_db_runs_as_drafter_sd_and_says_so(graph):
    """The default method, heisd, with no router statistics: configured, degraded, warned."""
    policy = graph[0]
    node = PolicyNode("no_db_policy", context=policy.context, parameter_overrides=[
        Parameter("model.path", value=policy.model_config.path),
        Parameter("model.drafter_path", value=policy.model_config.drafter_path),
        Parameter("model.db_dir", value="/nonexistent/heisd_db")])
    try:
        assert node.config.method == "heisd"
        assert node.config_error == "" and node.decoder is not None
        assert node.decoder.degraded.startswith("heisd runs as drafter SD: no router "
                                                "statistics (model.db_dir '/nonexistent/heisd_db'")
        status = node.diagnostic_status()
        values = {kv.key: kv.value for kv in status.values}
        assert status.level == status.WARN and status.message == node.decoder.degraded
        assert values["degraded"] == node.decoder.degraded
        assert values["decoder"].startswith("heisd runs as drafter SD")
    finally:
        node.destroy_node()


def test_an_unknown_method_is_a_configuration_error_naming_the_valid_ones(graph):
    node = PolicyNode("bad_method_policy", context=graph[0].context, parameter_overrides=[
        Parameter("method", value="hiesd")])
    try:
        assert node.decoder is None
        from heisd_ros.decoding.methods import METHOD_NAMES

        assert node.config_error == ("policy not configured: invalid parameters: method: "
                                     f"unknown method 'hiesd'; valid: {', '.join(METHOD_NAMES)}")
    finally:
        node.destroy_node()


def test_set_instruction_service(graph):
    policy, _broken, peer, _pubs, executor, _out = graph
    client = peer.create_client(hsrv.SetInstruction, "/policy_node/set_instruction")
    assert client.wait_for_service(timeout_sec=10)
    future = client.call_async(hsrv.SetInstruction.Request(instruction="stack them", task="t1"))
    assert spin_until(executor, future.done) and future.result().success
    assert (policy.instruction, policy.task) == ("stack them", "t1")
    future = client.call_async(hsrv.SetInstruction.Request(instruction=" "))
    assert spin_until(executor, future.done) and not future.result().success


def test_a_command_from_frames_too_old_when_ready_is_not_sent(graph):
    """The gate passed the frames, but decoding made them older than the limit: hold."""
    policy = graph[0]
    limit_s = policy.config.max_command_age_s
    policy.config.max_command_age_s = 1e-6  # any real transport + decode takes longer
    before = policy.episode
    try:
        cmds, refused = send(graph)
    finally:
        policy.config.max_command_age_s = limit_s
    assert cmds == [] and "stale command" in refused, (refused, policy.last_problem)
    assert "when the action was ready" in policy.last_problem
    # What the robot did not get leaves the episode as it was (step, gripper state).
    assert policy.episode == before
    cmds, refused = send(graph)
    assert len(cmds) == 1 and not refused
    after = policy.episode
    assert after.step_index == before.step_index + 1
    assert after.gripper_closed == (cmds[0].gripper == EECommand.GRIPPER_CLOSED)


def test_a_machine_too_slow_for_the_age_limit_is_named_once_with_what_to_do(graph):
    """Decode time above max_command_age_s: one warning, kept in diagnostics, with figures."""
    from heisd_ros.nodes.policy_staleness import TOO_SLOW_MIN_STEPS

    policy = graph[0]
    limit_s = policy.config.max_command_age_s
    policy.config.max_command_age_s = 1e-6  # every real decode takes longer
    try:
        for _ in range(TOO_SLOW_MIN_STEPS):
            send(graph)
    finally:
        policy.config.max_command_age_s = limit_s
    warning = policy.too_slow_warning
    assert "more than max_command_age_s = 1e-06 s" in warning, warning
    assert "GPU" in warning and "raise max_command_age_s" in warning
    values = {kv.key: kv.value for kv in policy.diagnostic_status().values}
    assert values["too_slow"] == warning
    assert float(values["held_stale_share"]) > 0 and float(values["decode_p50_ms"]) > 0
    assert float(values["decode_p99_ms"]) >= float(values["decode_p50_ms"])


def test_a_dead_decode_worker_stops_the_policy_with_the_reason(graph):
    """Its decode worker killed, a policy acts on nothing more and says why (ERROR)."""
    import signal

    policy, _broken, _peer, _pubs, executor, _out = graph
    node = PolicyNode("dying_worker_policy", context=policy.context, parameter_overrides=[
        Parameter("method", value="ar"), Parameter("model.path", value=policy.model_config.path),
        Parameter("instruction", value="pick it"), Parameter("input.max_age_s", value=2.0),
        Parameter("max_command_age_s", value=2.0), Parameter("input.max_state_skew_s", value=2.0),
        Parameter("input_timeout_s", value=30.0)])
    executor.add_node(node)
    try:
        pid = node.decoder.pid
        node.decoder._proc.send_signal(signal.SIGKILL)
        node.decoder._proc.wait(timeout=30)
        send(graph)  # the frames and the state reach this policy too
        assert spin_until(executor, lambda: node.config_error.startswith("policy stopped"))
        assert f"(pid {pid}) exited with code -9" in node.config_error, node.config_error
        assert node.decoder is None and node.commands_sent == 0
        status = node.diagnostic_status()
        assert status.level == status.ERROR and "restart the node" in status.message
    finally:
        executor.remove_node(node)
        node.destroy_node()


def _diag(out, name="policy_node: policy"):
    return next((s for d in reversed(out["diag"]) for s in d.status if s.name == name), None)


def test_a_silent_camera_is_named_and_diagnostics_return_to_ok(graph):
    policy, _broken, _peer, _pubs, executor, out = graph
    cmds, _ = send(graph)
    assert len(cmds) == 1
    timeout_s = policy.config.input_timeout_s
    policy.config.input_timeout_s = 0.3
    reports = policy.refusals["waiting for input"]
    try:
        # Both cameras stop: the node must say so by itself (nothing else is refused).
        assert spin_until(executor, lambda: policy.refusals["waiting for input"] > reports)
        problem = policy.last_problem
        assert problem.startswith("waiting for input: /camera/third_person/image_raw (silent "
                                  "for"), problem
        assert "/camera/wrist/image_raw (silent for" in problem
        n = len(out["diag"])
        assert spin_until(executor, lambda: len(out["diag"]) > n and _diag(out) is not None
                          and _diag(out).level == _diag(out).WARN)
        assert "silent for" in _diag(out).message
    finally:
        policy.config.input_timeout_s = timeout_s
    cmds, _ = send(graph)  # input is good again: a command, and diagnostics say OK
    assert len(cmds) == 1 and policy.last_problem == ""
    n = len(out["diag"])
    assert spin_until(executor, lambda: len(out["diag"]) > n + 1)
    status = _diag(out)
    values = {kv.key: kv.value for kv in status.values}
    assert status.level == status.OK, status.message
    assert values["last_refusal"].startswith("waiting for input")


def test_an_episode_that_starts_again_resets_the_episode_state(graph):
    from heisd_ros.nodes.qos import STATUS_QOS

    policy, _broken, peer, _pubs, executor, _out = graph
    pub = peer.create_publisher(hmsg.EpisodeStatus, "/heisd/episode_status", STATUS_QOS)

    def status(step, done=False):
        started = policy.episodes_started
        pub.publish(hmsg.EpisodeStatus(suite="piper_goal", task="t", episode=0, seed=0,
                                       step=step, done=done))
        assert spin_until(executor, lambda: policy.episodes.progress == (step, done))
        cmds, refused = send(graph)
        assert len(cmds) == 1 and not refused, refused
        return policy.episodes_started - started

    assert spin_until(executor, lambda: pub.get_subscription_count() >= 1)
    status(0)                       # whatever came before, this key is now current
    assert status(4) == 0           # the same episode goes on
    assert status(0) == 1           # a restarted sim begins episode 0 again: new
    assert status(3, done=True) == 0
    assert status(3) == 1           # running again after it was done: new
    # A jump of the robot state (reset by hand, teach mode) is a new episode too.
    started = policy.episodes_started
    cmds, _ = send(graph, ee_x_m=0.3 + 2 * policy.config.episode_jump_m)
    assert len(cmds) == 1 and policy.episodes_started == started + 1
    cmds, _ = send(graph, ee_x_m=0.3 + 2 * policy.config.episode_jump_m + 0.01)
    assert len(cmds) == 1 and policy.episodes_started == started + 1  # a small move: no
    send(graph)                     # back to where the other tests expect the arm
    # A new task (the DB collection) is a new episode; setting the same one again is not.
    for task, new, steps in (("other", 1, 1), ("other", 0, 2), ("", 1, 1)):
        started = policy.episodes_started
        policy.set_parameters([Parameter("task", value=task)])
        cmds, _ = send(graph)
        assert len(cmds) == 1 and policy.episodes_started == started + new
        assert (policy.episode.task, policy.episode.step_index) == (task or None, steps)
