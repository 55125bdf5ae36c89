"""The deployed graph on an OpenVLA checkpoint: sim + retrieval + policy, one process each.

The tiny random checkpoint in OpenVLA's real layout runs the policy node with the full method
(``heisd``) as a user runs OpenVLA-7B, with the DB a user builds for it: expert episodes
recorded to rosbag2 (``heisd-record``), ``heisd-build-db --model openvla`` over them (OpenVLA's
pooled DINOv2 + SigLIP features of both cameras, router statistics of the suite), the policy
reading ``model.db_dir`` as the launch argument ``db`` sets it. The only test-specific parts:
``model.vision_specs`` (the tiny backbones' sizes), ``model.allow_cpu`` (no GPU here) and a
calibration that routes every step with a full router window to retrieval, so retrieval
drafts verified by OpenVLA show on the first steps.
"""

from __future__ import annotations

import numpy as np
import pytest

from test.polling import spin_until
from test.ros_env import require_ros

rclpy, hmsg, _ = require_ros()

from geometry_msgs.msg import PoseStamped  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402

from test.openvla_fixtures import write_tiny_openvla, write_vision_specs  # noqa: E402
from test.test_node_policy_graph import NodeProcess, logs  # noqa: E402

EECommand, HybridStep = hmsg.EECommand, hmsg.HybridStep
SUITE, TASK, KEY = "piper_goal", "red_block_on_plate", "libero_spatial"
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def openvla_db(tmp, checkpoint, specs) -> None:
    """``tmp/db``: heisd-build-db over two recorded expert episodes, with OpenVLA."""
    from heisd_ros.calibration.verify_skip import VerifySkipCalibration
    from heisd_ros.tools import build_db, record

    assert record.main(["--suite", SUITE, "--task", TASK, "--policy", "expert", "--episodes",
                        "2", "--max-steps", "8", "--image-size", "64", "--out",
                        str(tmp / "bags"), "--storage", "sqlite3"]) == 0
    assert build_db.main(["--demos", str(tmp / "bags"), "--db", str(tmp / "db"), "--model",
                          "openvla", "--checkpoint", str(checkpoint), "--unnorm-key", KEY,
                          "--vision-specs", str(specs), "--router-window", "4",
                          "--hold-out-every", "0", "--exact"]) == 0
    VerifySkipCalibration(skip_threshold=1.0, router_threshold=0.0, precision_target=0.9,
                          skip_precision=float("nan"), skip_support=0, skip_rate=0.0,
                          hidden_similarity_threshold=1.0, n_held_out_steps=0, n_pairs=0,
                          notes="test: always route to retrieval, never skip").save(
        tmp / "db" / "calibration.json")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, module_ros_domain):
    tmp = tmp_path_factory.mktemp("openvla_graph")
    checkpoint = write_tiny_openvla(tmp / "ckpt")
    specs = write_vision_specs(tmp / "vision_specs.json")
    openvla_db(tmp, checkpoint, specs)
    domain = module_ros_domain
    procs = {
        "retrieval_node": NodeProcess("retrieval_node", tmp, domain, {
            "store.path": str(tmp / "db"), "store.exact_search": True}),
        "sim_node": NodeProcess("sim_node", tmp, domain, {
            "mode": "lockstep", "sim.image_width_px": 64, "sim.image_height_px": 64,
            "max_steps": 2000, "frame_republish_s": 1.0}),
        "policy_node": NodeProcess("policy_node", tmp, domain, {
            "method": "heisd", "model.type": "openvla", "model.checkpoint": str(checkpoint),
            "model.unnorm_key": KEY, "model.vision_specs": str(specs), "model.allow_cpu": True,
            "model.db_dir": str(tmp / "db"), "model.retrieval_deadline_s": 0.5}),
    }
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=domain)
    node = rclpy.create_node("openvla_graph_listener", context=context)
    seen = {"cmd": [], "step": [], "pose": []}
    node.create_subscription(EECommand, "/heisd/ee_command", seen["cmd"].append, 50)
    node.create_subscription(HybridStep, "/heisd/hybrid_step", seen["step"].append, 50)
    node.create_subscription(PoseStamped, "/ee_pose", seen["pose"].append, 10)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    yield procs, executor, seen
    for proc in procs.values():
        proc.stop()
    executor.shutdown()
    node.destroy_node()
    rclpy.shutdown(context=context)


def test_heisd_on_openvla_retrieval_drafts_verified_by_openvla_move_the_arm(deployment):
    procs, executor, seen = deployment

    def retrieval_steps():
        return [s for s in seen["step"] if s.draft_source == HybridStep.DRAFT_RETRIEVAL]

    assert spin_until(executor, lambda: len(retrieval_steps()) >= 2, 120), logs(procs)
    policy_log = procs["policy_node"].text()
    assert "policy configured: method 'heisd', target OpenVLA " in policy_log, policy_log
    assert "unnorm_key=libero_spatial_no_noops, cpu, float32" in policy_log
    steps = retrieval_steps()
    # the router chose the DB; OpenVLA verified the candidates (no step skipped it)
    assert all(s.router_mode == HybridStep.ROUTER_RETRIEVAL for s in steps)
    assert all(s.retrieval_calls >= 1 and s.target_forwards >= 1 and not s.verify_skipped
               for s in steps), [(s.target_forwards, s.status) for s in steps]
    assert all(s.vision_ms > 0 and s.retrieval_ms > 0 and s.total_ms > 0 for s in steps)
    assert seen["cmd"] and {c.source for c in seen["cmd"]} <= {
        EECommand.SOURCE_RETRIEVAL, EECommand.SOURCE_DRAFTER, EECommand.SOURCE_AR}
    assert spin_until(executor, lambda: len(seen["pose"]) >= 2, 10)
    first, last = seen["pose"][0].pose.position, seen["pose"][-1].pose.position
    assert np.linalg.norm([last.x - first.x, last.y - first.y, last.z - first.z]) > 1e-4
    print(f"\nOPENVLA GRAPH: {len(seen['step'])} HybridSteps, {len(steps)} from retrieval "
          f"drafts; median vision {np.median([s.vision_ms for s in steps]):.1f} ms, retrieval "
          f"{np.median([s.retrieval_ms for s in steps]):.1f} ms, total "
          f"{np.median([s.total_ms for s in steps]):.1f} ms per step (tiny model, CPU)")
