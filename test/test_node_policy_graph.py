"""The sim graph over real DDS, one process per node: sim + policy + retrieval.

The three node programs run as in a deployment (``nodes/<name>`` with the shipped YAML plus
test overrides) on a DDS domain of their own; this process only listens. A tiny random VLA
and draft head, and a small retrieval DB with random points for the sim task, keep it cheap.
Checked: commands flow and the arm moves; retrieval drafts are used; when the retrieval node
is killed mid-episode commands keep flowing in the method's fallback mode (drafter, or AR for
pure retrieval SD); when it is back, retrieval is used again. The policy's latency figures
(image stamp -> command publish) are printed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from test.ros_env import require_ros

rclpy, hmsg, _ = require_ros()

from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from geometry_msgs.msg import PoseStamped  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402

from test.test_node_policy import tiny_models  # noqa: E402

EECommand, HybridStep = hmsg.EECommand, hmsg.HybridStep
REPO = Path(__file__).resolve().parents[1]
TASK = "red_block_on_plate"
METHOD = "retrieval"  # retrieval SD without a router: every step asks the DB


def build_db(path: Path, vla_path: str) -> None:
    """A DB whose dimension matches the tiny VLA's embedding, with random points for TASK."""
    from heisd_ros.data.observation import Observation
    from heisd_ros.models.checkpoint import load_small_vla
    from heisd_ros.retrieval.embedding import embedding_dimension
    from heisd_ros.retrieval.records import records_from_episode
    from heisd_ros.retrieval.store import open_store
    from heisd_ros.retrieval.store_config import StoreConfig

    image = np.zeros((32, 32, 3), np.uint8)
    dim = embedding_dimension(load_small_vla(vla_path), Observation(image, image, "x"))
    rng = np.random.default_rng(0)
    n = 32
    vectors = rng.normal(size=(n, dim)).astype(np.float32)
    records = records_from_episode(TASK, 0, rng.integers(0, 256, size=(n, 7)),
                                   rng.normal(size=(n, 7)) * 0.01, rng.normal(size=(n, 3)))
    with open_store(StoreConfig(path=str(path), exact_search=True), create=True,
                    dimension=dim, model_fingerprint="tiny-test") as store:
        store.create_collection(TASK)
        store.upsert(TASK, range(n), vectors, [r.to_payload() for r in records])
        store.finalize()


class NodeProcess:
    """``nodes/<name>`` in a subprocess with the shipped YAML plus overrides."""

    def __init__(self, name: str, tmp: Path, domain: int, overrides: dict) -> None:
        params = yaml.safe_load((REPO / "config" / f"{name}.yaml").read_text())
        merged = params[name]["ros__parameters"]
        for key, value in overrides.items():
            *parents, leaf = key.split(".")
            node = merged
            for part in parents:
                node = node[part]
            node[leaf] = value
        params_file = tmp / f"{name}.yaml"
        params_file.write_text(yaml.safe_dump({name: {"ros__parameters": merged}}))
        self.log = tmp / f"{name}.log"
        env = dict(os.environ, ROS_DOMAIN_ID=str(domain), PYTHONPATH=os.pathsep.join(
            [str(REPO)] + os.environ.get("PYTHONPATH", "").split(os.pathsep)))
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(REPO / "nodes" / name), "--ros-args", "--params-file",
                 str(params_file)], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp)

    def text(self) -> str:
        """Everything the node printed so far."""
        return self.log.read_text()

    def stop(self, sig=signal.SIGINT) -> None:
        """Stop the node (SIGINT: clean; SIGKILL: it dies)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """The three nodes plus a listening node in this process."""
    tmp = tmp_path_factory.mktemp("graph")
    vla, head = tiny_models(tmp)
    build_db(tmp / "db", vla)
    domain = 5 + os.getpid() % 5  # 5..9: no other test uses it
    retrieval_overrides = {"store.path": str(tmp / "db"), "store.exact_search": True}
    procs = {
        "retrieval_node": NodeProcess("retrieval_node", tmp, domain, retrieval_overrides),
        "sim_node": NodeProcess("sim_node", tmp, domain, {
            "sim.image_width_px": 64, "sim.image_height_px": 64, "max_steps": 2000,
            "frame_republish_s": 1.0}),
        "policy_node": NodeProcess("policy_node", tmp, domain, {
            "method": METHOD, "model.path": vla, "model.drafter_path": head,
            "model.retrieval_deadline_s": 0.5, "diagnostics_period_s": 0.5}),
    }
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=domain)
    node = rclpy.create_node("graph_test_listener", context=context)
    seen = {"cmd": [], "step": [], "pose": [], "diag": [], "cmd_rx": []}

    def on_command(msg):
        seen["cmd"].append(msg)
        seen["cmd_rx"].append(node.get_clock().now().nanoseconds * 1e-9)

    node.create_subscription(EECommand, "/heisd/ee_command", on_command, 50)
    node.create_subscription(HybridStep, "/heisd/hybrid_step", seen["step"].append, 50)
    node.create_subscription(PoseStamped, "/ee_pose", seen["pose"].append, 10)
    node.create_subscription(DiagnosticArray, "/diagnostics", seen["diag"].append, 10)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    yield procs, executor, seen, (tmp, domain, retrieval_overrides)
    for proc in procs.values():
        proc.stop()
    executor.shutdown()
    node.destroy_node()
    rclpy.shutdown(context=context)


def spin_until(executor, condition, timeout_s):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and not condition():
        executor.spin_once(timeout_sec=0.05)
    return condition()


def logs(procs) -> str:
    return "\n".join(f"--- {name}\n{p.text()[-3000:]}" for name, p in procs.items())


def test_episode_with_retrieval_then_drafter_mode_then_retrieval_again(deployment):
    procs, executor, seen, (tmp, domain, retrieval_overrides) = deployment

    def retrieval_steps(since=0):
        return [s for s in seen["step"][since:] if s.draft_source == HybridStep.DRAFT_RETRIEVAL]

    # 1. commands flow; retrieval drafts are used
    assert spin_until(executor, lambda: len(retrieval_steps()) >= 3, 90), logs(procs)
    assert seen["cmd"] and all(c.header.frame_id == "base_link" for c in seen["cmd"])
    assert {c.source for c in seen["cmd"]} <= {EECommand.SOURCE_RETRIEVAL,
                                                EECommand.SOURCE_DRAFTER, EECommand.SOURCE_AR}

    # 2. the retrieval node dies mid-episode: commands keep flowing in the method's fallback
    # mode (the draft head when the method has one, else AR)
    from heisd_ros.decoding.hybrid import METHODS

    fallback = "drafter" if METHODS[METHOD].drafter else "AR"
    expected = HybridStep.DRAFT_DRAFTER if METHODS[METHOD].drafter else HybridStep.DRAFT_NONE
    procs["retrieval_node"].stop(signal.SIGKILL)
    killed_at = len(seen["step"])
    assert spin_until(executor, lambda: len(seen["step"]) >= killed_at + 4, 60), logs(procs)
    after = seen["step"][killed_at + 1:]  # the step in flight at the kill may still retrieve
    assert after and all(s.draft_source == expected for s in after), [
        (s.draft_source, s.status) for s in after]
    assert all(f"{fallback} mode" in s.status for s in after), [s.status for s in after]

    # 3. it comes back: retrieval is used again
    procs["retrieval_node"] = NodeProcess("retrieval_node", tmp, domain, retrieval_overrides)
    back_at = len(seen["step"])
    assert spin_until(executor, lambda: retrieval_steps(back_at), 90), logs(procs)

    # the arm moved under the commands
    assert spin_until(executor, lambda: len(seen["pose"]) >= 2, 10)
    first, last = seen["pose"][0].pose.position, seen["pose"][-1].pose.position
    moved = np.linalg.norm([last.x - first.x, last.y - first.y, last.z - first.z])
    assert moved > 1e-4

    # latency: image stamp -> command publish (policy) and -> receipt here. More steps for a
    # measurement: HEISD_LATENCY_STEPS=200 pytest test/test_node_policy_graph.py -s
    extra = int(os.environ.get("HEISD_LATENCY_STEPS", "0"))
    measured_from = len(seen["cmd"])
    assert spin_until(executor, lambda: len(seen["cmd"]) >= measured_from + extra, 10 + extra)
    assert spin_until(executor, lambda: any(
        s.name == "policy_node: policy" and any(kv.key == "latency_p50_ms" for kv in s.values)
        for d in seen["diag"] for s in d.status), 10)
    status = [s for d in seen["diag"] for s in d.status if s.name == "policy_node: policy"][-1]
    values = {kv.key: kv.value for kv in status.values}
    window = seen["cmd"][measured_from:] if extra else seen["cmd"]
    rx = dict(zip((id(c) for c in seen["cmd"]), seen["cmd_rx"], strict=True))
    received = {c.step_index: (rx[id(c)] - c.header.stamp.sec - c.header.stamp.nanosec * 1e-9)
                * 1e3 for c in window}
    steps = [s for s in seen["step"] if s.step_index in received]
    lat = np.array([received[s.step_index] for s in steps])
    decode = np.array([s.total_ms for s in steps])
    service = np.array([s.retrieval_ms for s in steps])
    print(f"\nLATENCY policy diagnostics (all {values['steps']} steps, incl. warm-up and the "
          f"retrieval kill): p50 {values['latency_p50_ms']} ms, p99 {values['latency_p99_ms']} "
          f"ms, image stamp -> newer frame received p50 {values['transport_p50_ms']} ms, -> step "
          f"start p50 {values['input_p50_ms']} ms, decode p50 "
          f"{values['decode_p50_ms']} ms, ROS share (median) {values['ros_overhead_share']}")
    print(f"LATENCY subscriber, {len(lat)} steps{' after the restart' if extra else ''}: "
          f"image stamp -> command receipt p50 {np.percentile(lat, 50):.1f} ms, p99 "
          f"{np.percentile(lat, 99):.1f} ms; decoder p50 {np.median(decode):.1f} ms; ROS "
          f"messages share (median) {np.median((lat - decode) / lat):.3f}; retrieval service "
          f"share (median) {np.median(service / lat):.3f}")
