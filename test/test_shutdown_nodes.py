"""Every node program stops cleanly and fast on SIGINT and SIGTERM, also on a second signal.

Each node runs from ``nodes/<name>`` in its own process with the shipped YAML (the policy
with the shipped small VLA), renamed and with its topics moved under a prefix of this test
so other tests on the same DDS domain cannot mix in. Once it answers its parameter service
(the policy: once it is decoding frames from a sim node) it gets the signal; it must exit
with code 0 within :data:`LIMIT_S`, print no traceback, and say it is shutting down (the
log is flushed before the process leaves). ``ros2 launch`` escalates to SIGTERM after 5 s,
and Ctrl-C in its terminal sends SIGINT twice (the terminal's and launch's).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from test.node_process import NodeProcess, write_params
from test.polling import spin_until
from test.ros_env import require_ros

rclpy, hmsg, _ = require_ros()

from rcl_interfaces.srv import ListParameters  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# ros2 launch escalates to SIGTERM when a node is still running sigterm_timeout (5 s) after
# its SIGINT: a node must be gone before that, on a loaded machine too
LIMIT_S = 5.0
PREFIX = f"/shutdown_test_{os.getpid()}"
# Topics shared by the sim (or driver) and the policy, moved under PREFIX for this test.
TOPICS = ("/joint_states", "/ee_pose", "/camera/third_person/image_raw",
          "/camera/wrist/image_raw", "/heisd/episode_status", "/heisd/ee_command",
          "/heisd/hybrid_step", "/heisd/ee_path", "/heisd/router_markers", "/diagnostics")
POLICY_RUNS = 5  # the old handler's traceback came in about one shutdown of three


class Node(NodeProcess):
    """``nodes/<program>`` renamed to ``name``, shipped YAML + ``overrides``, topics moved."""

    def __init__(self, program: str, name: str, tmp: Path, domain: int,
                 overrides: dict | None = None) -> None:
        tmp = tmp / name
        tmp.mkdir(exist_ok=True)
        params = write_params(tmp / "params.yaml", program, overrides or {})
        remaps = [a for t in TOPICS for a in ("-r", f"{t}:={PREFIX}{t}")]
        self.name = name
        super().__init__([str(REPO / "nodes" / program), "--ros-args", "--params-file",
                          str(params), "-r", f"__node:={name}", *remaps], tmp, domain)


@pytest.fixture(scope="module")
def ros(module_ros_domain):
    """This process's side: a private context on a domain of its own, a node, an executor."""
    domain = module_ros_domain
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=domain)
    node = rclpy.create_node("shutdown_test_peer", context=context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    steps: list = []
    node.create_subscription(hmsg.HybridStep, f"{PREFIX}/heisd/hybrid_step", steps.append, 50)
    yield domain, node, executor, steps
    executor.shutdown()
    node.destroy_node()
    rclpy.shutdown(context=context)


def wait_until_up(ros, proc: Node, timeout_s: float = 120.0) -> None:
    """Until the node answers its parameter service: constructed and spinning."""
    _, node, executor, _ = ros
    client = node.create_client(ListParameters, f"/{proc.name}/list_parameters")
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            assert proc.proc.poll() is None, f"{proc.name} died: {proc.text()[-3000:]}"
            assert time.monotonic() < deadline, f"{proc.name} never answered: {proc.text()}"
            if not client.wait_for_service(timeout_sec=1.0):
                continue
            future = client.call_async(ListParameters.Request())
            executor.spin_until_future_complete(future, timeout_sec=2.0)
            if future.done():
                return
            client.remove_pending_request(future)
    finally:
        node.destroy_client(client)


def stop_and_time(ros, proc: Node, signals: tuple[int, ...]) -> float:
    """Send the signals; the seconds from the first until the process exited.

    Each later signal goes out once the node has logged that it acts on the first (its
    teardown is under way) or has exited: a second Ctrl-C during shutdown. Waiting on the
    log, not on the ROS graph: this process's view of the graph can lag, and two signals
    pending together are run by Python in signal-number order (SIGINT before SIGTERM).
    """
    _, _node, executor, _ = ros
    first = f"{signal.Signals(signals[0]).name}: shutting down"
    start = time.monotonic()
    proc.proc.send_signal(signals[0])
    for sig in signals[1:]:
        spin_until(executor, lambda: proc.proc.poll() is not None or first in proc.text(), 15)
        proc.proc.send_signal(sig)  # harmless once it has exited
    try:
        proc.proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.proc.kill()
        proc.proc.wait()
        raise
    return time.monotonic() - start


def check_clean(proc: Node, seconds: float, signals: tuple[int, ...]) -> None:
    text = proc.text()
    print(f"\nSHUTDOWN {proc.name} {'+'.join(signal.Signals(s).name for s in signals)}: "
          f"{seconds:.2f} s, exit code {proc.proc.returncode}")
    assert proc.proc.returncode == 0, text[-3000:]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    assert f"{signal.Signals(signals[0]).name}: shutting down" in text, text  # log flushed
    assert seconds < LIMIT_S, f"{proc.name} took {seconds:.2f} s to exit"


BOTH = (signal.SIGINT, signal.SIGINT)
CASES = {  # program -> (YAML overrides, the signal sequences tried)
    "sim_node": ({"sim.image_width_px": 64, "sim.image_height_px": 64},
                 [(signal.SIGINT,), (signal.SIGTERM,), BOTH]),
    "retrieval_node": ({"store.path": "no_db"}, [(signal.SIGINT,), (signal.SIGTERM,), BOTH]),
    "piper_driver_node": ({"emulate": True, "interface": "virtual"},
                          [(signal.SIGINT,), (signal.SIGTERM,), (signal.SIGTERM, signal.SIGINT)]),
}


@pytest.mark.parametrize("program", list(CASES))
def test_a_node_stops_cleanly_on_each_signal(ros, tmp_path, program):
    domain = ros[0]
    overrides, sequences = CASES[program]
    for i, signals in enumerate(sequences):
        name = f"sd_{program}_{os.getpid()}_{i}"
        if program == "piper_driver_node":  # the SDK's virtual bus is per channel name
            overrides = {**overrides, "can_channel": name}
        proc = Node(program, name, tmp_path, domain, overrides)
        try:
            wait_until_up(ros, proc)
            check_clean(proc, stop_and_time(ros, proc, signals), signals)
        finally:
            proc.stop()


def test_the_policy_stops_cleanly_while_decoding(ros, tmp_path):
    """The shipped small VLA decoding a sim's frames, stopped again and again."""
    domain, _node, executor, steps = ros
    sim = Node("sim_node", f"sd_sim_for_policy_{os.getpid()}", tmp_path, domain,
               {"max_steps": 100000, "frame_republish_s": 0.5})
    sequences = [(signal.SIGINT,)] * POLICY_RUNS + [(signal.SIGTERM,), BOTH,
                                                    (signal.SIGINT, signal.SIGTERM)]
    times = []
    try:
        wait_until_up(ros, sim)
        for i, signals in enumerate(sequences):
            policy = Node("policy_node", f"sd_policy_{os.getpid()}_{i}", tmp_path, domain)
            try:
                wait_until_up(ros, policy)
                seen = len(steps)
                assert spin_until(executor, lambda seen=seen: len(steps) >= seen + 2, 60), \
                    policy.text()[-3000:]  # it is decoding when the signal comes
                times.append(stop_and_time(ros, policy, signals))
                check_clean(policy, times[-1], signals)
            finally:
                policy.stop()
    finally:
        sim.stop()
    print(f"\nSHUTDOWN policy_node: max {max(times):.2f} s over {len(times)} runs")


def test_the_signal_handler_only_records_the_first_signal():
    """In this process: no exception from the handler, a later signal changes nothing."""
    from heisd_ros.nodes._spin import StopRequest

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        stop = StopRequest().install()
        # raise_signal delivers synchronously: the Python handler has run when it returns
        signal.raise_signal(signal.SIGTERM)
        assert stop.signum == signal.SIGTERM
        signal.raise_signal(signal.SIGINT)  # the old handler: KeyboardInterrupt right here
        assert stop.signum == signal.SIGTERM
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
