"""heisd-view live: what a graph publishes over real DDS becomes logged steps, read back."""

from __future__ import annotations

import time

import numpy as np
import pytest

from test.polling import spin_until, wait_until

pytest.importorskip("rerun", reason="the view extra (rerun-sdk) is not installed")
rclpy = pytest.importorskip("rclpy")

STEPS = 4
SIZE_PX = 16


def _stamp(t_s: float):
    from builtin_interfaces.msg import Time

    return Time(sec=int(t_s), nanosec=int(round((t_s % 1) * 1e9)))


def test_live_steps_pair_frames_joints_and_commands_by_stamp(tmp_path):
    from heisd_ros.msg import EECommand, EpisodeStatus, HybridStep
    from rclpy.executors import SingleThreadedExecutor
    from sensor_msgs.msg import Image, JointState

    from heisd_ros.nodes.qos import STATUS_QOS
    from heisd_ros.nodes.sim_node import THIRD_PERSON_TOPIC, WRIST_TOPIC
    from heisd_ros.tools.graph.listener import GraphListener
    from heisd_ros.tools.view_live import LiveView
    from heisd_ros.viewer.episode_log import EpisodeLog
    from heisd_ros.viewer.output import Output, open_recording
    from heisd_ros.viewer.readback import column_values, entity_rows

    out = tmp_path / "live.rrd"
    recording, _ = open_recording(Output(save=str(out)), "live test")
    view = LiveView(EpisodeLog(recording))
    context = rclpy.Context()
    rclpy.init(context=context)
    listener = GraphListener.on_own_thread(context, "heisd_view_test", cameras=True,
                                           robot_state=True, episodes=True, keep=8,
                                           tap=view.tap)
    node = rclpy.create_node("fake_graph", context=context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    pubs = {"third_person": node.create_publisher(Image, THIRD_PERSON_TOPIC, 10),
            "wrist": node.create_publisher(Image, WRIST_TOPIC, 10),
            "state": node.create_publisher(JointState, "/joint_states", 10),
            "command": node.create_publisher(EECommand, "/heisd/ee_command", 10),
            "step": node.create_publisher(HybridStep, "/heisd/hybrid_step", 10),
            "status": node.create_publisher(EpisodeStatus, "/heisd/episode_status",
                                            STATUS_QOS)}
    try:
        assert spin_until(executor, lambda: all(
            p.get_subscription_count() > 0 for p in pubs.values()), 20.0), "no listener"
        pubs["status"].publish(EpisodeStatus(suite="piper_goal", task="t", episode=1, seed=3))
        joints = np.array([0.1, 1.0, -1.0, 0.2, 0.5, -0.3])
        for k in range(STEPS):
            stamp = _stamp(time.time())
            image = Image(height=SIZE_PX, width=SIZE_PX, encoding="rgb8", step=3 * SIZE_PX,
                          data=bytes([40 * k]) * (3 * SIZE_PX * SIZE_PX))
            image.header.stamp = stamp
            pubs["third_person"].publish(image)
            pubs["wrist"].publish(image)
            pubs["state"].publish(JointState(
                name=[f"joint{i}" for i in range(1, 7)] + ["gripper"],
                position=[*(joints + 0.01 * k), 0.03]))
            command = EECommand(step_index=k + 1)
            command.header.stamp = stamp
            pubs["command"].publish(command)
            # The step goes last, once its frames, joint state and command have arrived.
            assert wait_until(lambda k=k: len(listener.commands) > k
                              and all(len(listener.frames[c]) > k for c in listener.frames)
                              and len(listener.states) > k, 20.0), f"step {k}: inputs"
            step = HybridStep(step_index=k, total_ms=12.5 + k, draft_source=1,
                              accepted_length_per_round=[3, 2])
            step.header.stamp = stamp
            pubs["step"].publish(step)
            assert wait_until(lambda k=k: len(listener.steps) > k, 20.0), f"step {k}: step"
        assert wait_until(lambda: view.pump() >= 0 and view.log.steps == STEPS, 20.0)
    finally:
        listener.close()
        node.destroy_node()
        executor.shutdown()
        rclpy.shutdown(context=context)
    recording.flush()
    recording.disconnect()
    assert view.episodes == 1 and view.skipped == {}
    rows = entity_rows(out)
    for entity in ("/cameras/third_person", "/cameras/wrist", "/robot/joints/joint1"):
        assert rows.get(entity) == STEPS, (entity, rows.get(entity))
    # The scalars have one static style row; the status lines open with the episode's.
    assert rows["/metrics/command_age_ms"] == rows["/steps/status"] == STEPS + 1
    ages = [v[0] for v in column_values(out, "/metrics/command_age_ms", "Scalars:scalars")]
    assert all(0.0 <= a < 20_000.0 for a in ages), ages
    latency = [v[0] for v in column_values(out, "/metrics/latency_ms", "Scalars:scalars")]
    assert latency == [12.5 + k for k in range(STEPS)]
    from heisd_ros.robot.piper_kinematics import PiperKinematics

    last = np.asarray(column_values(out, "/world/ee_steps", "Points3D:positions")[-1], float)
    want = [PiperKinematics().fk(joints + 0.01 * k)[:3, 3] for k in range(STEPS)]
    assert np.allclose(last, want, atol=1e-6)
