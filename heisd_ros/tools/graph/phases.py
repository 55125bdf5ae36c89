"""One method's phase of the launched graph: start its nodes, wait until ready, measure, stop.

- :func:`run_graph_phase` (``heisd-bench graph``): the PIPER driver (emulated arm), for a
  method with retrieval the retrieval node (or a faulty stand-in), and the policy node; this
  process plays both cameras and the robot state from a :class:`.replay.Replay` and listens.
- :func:`run_sim_phase` (``heisd-bench sim-graph``): the launch's sim graph (policy,
  retrieval and sim node); the sim node plays the inputs, this process only listens.

Both record through one :class:`.listener.GraphListener` and return the raw figures of the
measured window, which the reports turn into tables.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import yaml

from heisd_ros.tools.graph.figures import (
    count_log_lines,
    indices_of_stamps,
    parse_held_decodes,
    publish_gaps,
)
from heisd_ros.tools.graph.listener import (
    CAMERAS,
    DRIVER_DIAGNOSTICS,
    POLICY_DIAGNOSTICS,
    GraphListener,
)
from heisd_ros.tools.graph.processes import NodeProcesses, ros_parameters
from heisd_ros.tools.graph.replay import Replay, state_messages

ASSETS = Path(__file__).resolve().parents[2] / "assets"
_FATAL_RE = re.compile(r"policy not configured|policy stopped")
#: ``--retrieval-fault`` choices (``heisd-bench graph``'s docstring).
RETRIEVAL_FAULTS = ("none", "killed", "slow", "empty")
#: Child process name of each node of the sim graph (log file ``<name>.log``).
CHILD_NAMES = {"policy_node": "policy", "retrieval_node": "retrieval", "sim_node": "sim"}


# ------------------------------------------------------------------ heisd-bench graph
def policy_overrides(items: Sequence[str] | None) -> dict:
    """``KEY=VALUE`` texts as parameter overrides (values read as YAML: 0.4, false, text)."""
    out = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--policy-param: expected KEY=VALUE, got {item!r}")
        out[key.strip()] = yaml.safe_load(value) if value.strip() else ""
    return out


def write_phase_params(method: str, args, replay: Replay, tmp: Path) -> dict[str, Path]:
    """The params files of one phase (shipped YAMLs with the bench's few overrides)."""
    from heisd_ros.decoding.methods import METHODS
    from heisd_ros.nodes.graph import write_params_file

    policy = {"method": method, "instruction": replay.instruction, "task": replay.task,
              "warn_throttle_s": 0.0,
              "model.path": str(ASSETS / "small_vla.safetensors"),
              "model.drafter_path": str(ASSETS / "draft_head.safetensors")}
    files = {}
    if METHODS[method].hybrid:
        db = Path(args.db).resolve()
        policy["model.db_dir"] = str(db)
        if (db / "calibration.json").is_file():
            policy["model.calibration_path"] = str(db / "calibration.json")
        files["retrieval"] = write_params_file(tmp / f"retrieval_{method}.yaml",
                                               "retrieval_node", {"store.path": str(db)})
    policy.update(policy_overrides(args.policy_param))
    files["policy"] = write_params_file(tmp / f"policy_{method}.yaml", "policy_node", policy)
    files["driver"] = write_params_file(tmp / f"driver_{method}.yaml", "piper_driver_node", {
        "emulate": True, "interface": "virtual", "enable_on_start": True})
    return files


def run_graph_phase(method: str, args, replay: Replay, files: dict[str, Path], tmp: Path,
                    context, children: NodeProcesses) -> dict:
    """Start the graph, play the inputs, measure ``--duration-s``; return the raw figures."""
    import rclpy
    from geometry_msgs.msg import PoseStamped
    from rclpy.executors import SingleThreadedExecutor
    from sensor_msgs.msg import Image, JointState

    from heisd_ros.nodes.image_conversion import rgb_to_image
    from heisd_ros.nodes.robot_msgs import stamp_to_seconds

    phase_dir = tmp / method
    phase_dir.mkdir(exist_ok=True)
    children.tmp = phase_dir
    children.start("driver", "heisd_ros.nodes.piper_driver_node", files["driver"],
                   ["-r", "/joint_states:=/driver/joint_states",
                    "-r", "/ee_pose:=/driver/ee_pose"])
    fault = phase_fault(method, args, files)
    if fault and fault["mode"] in ("slow", "empty"):
        children.start("retrieval_fault", "heisd_ros.nodes.retrieval_fault", None,
                       program_args=["--mode", fault["mode"],
                                     "--delay-s", f"{args.fault_delay_s:g}"])
    elif "retrieval" in files:
        children.start("retrieval", "heisd_ros.nodes.retrieval_node", files["retrieval"])
    children.start("policy", "heisd_ros.nodes.policy_node", files["policy"])

    # One node plays the robot's inputs and listens, spun on this thread (timers and
    # callbacks in one loop, as a camera driver and the robot's state publisher would be).
    node = rclpy.create_node(f"heisd_graph_bench_{method}", context=context)
    clock = node.get_clock()
    listener = GraphListener(node)
    published: list[tuple[int, int]] = []  # (stamp ns, observation index)
    state_times: list[float] = []  # when each robot state went out, s
    state = {"frame": 0, "index": 0}
    cams = [node.create_publisher(Image, topic, 2) for topic in
            ("/camera/third_person/image_raw", "/camera/wrist/image_raw")]
    joint_pub = node.create_publisher(JointState, "/joint_states", 10)
    pose_pub = node.create_publisher(PoseStamped, "/ee_pose", 10)
    state_msgs = [state_messages(s) for s in replay.states]

    def publish_frames() -> None:
        index = state["frame"] % len(replay)
        state["frame"] += 1
        state["index"] = index
        stamp = clock.now().to_msg()
        published.append((stamp.sec * 1_000_000_000 + stamp.nanosec, index))
        for pub, rgb in zip(cams, (replay.third[index], replay.wrist[index]), strict=True):
            msg = rgb_to_image(rgb)
            msg.header.stamp, msg.header.frame_id = stamp, "base_link"
            pub.publish(msg)

    def publish_state() -> None:
        joint, pose = state_msgs[state["index"]]
        joint.header.stamp = pose.header.stamp = clock.now().to_msg()
        state_times.append(stamp_to_seconds(joint.header.stamp))
        joint_pub.publish(joint)
        pose_pub.publish(pose)

    node.create_timer(1.0 / args.camera_hz, publish_frames)
    node.create_timer(1.0 / args.state_hz, publish_state)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    policy_log = children.logs["policy"]
    result = {"method": method, "duration_s": args.duration_s, "logs": {
        k: str(v) for k, v in children.logs.items()}, "error": None, "died": None,
        "retrieval_fault": fault}
    try:
        print(f"[graph] {method}: waiting for the policy (first command or held step; at most "
              f"{args.ready_timeout_s:g} s); logs in {phase_dir}", flush=True)
        t_start, next_check = time.monotonic(), 0.0
        ready = False
        while time.monotonic() - t_start < args.ready_timeout_s:
            executor.spin_once(timeout_sec=0.05)
            if listener.commands:
                ready = True
                break
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + 0.5
                text = policy_log.read_text(errors="replace")
                if parse_held_decodes(text.splitlines()):
                    ready = True
                    break
                fatal = _FATAL_RE.search(text)
                if fatal or children.dead():
                    result["error"] = children.died() or f"policy: {fatal.group(0)}"
                    break
        result["ready_after_s"] = time.monotonic() - t_start
        if not ready:
            result["error"] = result["error"] or (f"not ready within "
                                                  f"{args.ready_timeout_s:g} s")
            return result
        _spin_for(executor, 1.5)  # a fresh diagnostics sample of every node
        before = listener.diagnostics_snapshot()
        if fault and fault["mode"] == "killed":
            fault["killed"] = children.kill("retrieval")
            print(f"[graph] {method}: fault drill: {fault['killed']}", flush=True)
        # The window: what arrives from here to t1 (callbacks run only inside spin_once).
        t0 = time.time()
        start_index = state["index"]
        end = time.monotonic() + args.duration_s
        while time.monotonic() < end:
            executor.spin_once(timeout_sec=0.05)
            if children.dead():
                result["died"] = children.died()
                break
        t1 = time.time()
        after = listener.diagnostics_snapshot()
    finally:
        executor.shutdown()
        node.destroy_node()
    commands, steps = listener.commands_between(t0, t1), listener.steps_between(t0, t1)
    lines = policy_log.read_text(errors="replace").splitlines()
    driver_lines = children.logs["driver"].read_text(errors="replace").splitlines()
    result.update({
        "duration_s": t1 - t0, "window": [t0, t1], "start_index": start_index,
        "ages_s": [c.age_s for c in commands], "hybrid_total_ms": [s.total_ms for s in steps],
        "hybrid_stamps_ns": [s.stamp_ns for s in steps],
        "hybrid_verify_skipped": [s.verify_skipped for s in steps],
        "hybrid_status": [s.status for s in steps],
        "hybrid_draft_source": [s.draft_source for s in steps],
        "hybrid_stages": [s.stages for s in steps], "camera_hz": args.camera_hz,
        "hybrid_behind": [(s.behind_result, s.behind_wait_ms) for s in steps],
        "hybrid_indices": indices_of_stamps(published, [s.stamp_ns for s in steps]),
        "held_ms": parse_held_decodes(lines, t0, t1),
        "frames_published": len(published),
        "bench_frames": publish_gaps([s * 1e-9 for s, _ in published], t0, t1),
        "bench_states": publish_gaps(state_times, t0, t1),
        "driver_watchdog_holds": count_log_lines(driver_lines, "controller watchdog_hold", t0,
                                                 t1),
        "policy_before": before.get(POLICY_DIAGNOSTICS, {}),
        "policy_after": after.get(POLICY_DIAGNOSTICS, {}),
        "driver_before": before.get(DRIVER_DIAGNOSTICS, {}),
        "driver_after": after.get(DRIVER_DIAGNOSTICS, {}),
        "diagnostics": after})
    return result


def phase_fault(method: str, args, files: dict[str, Path]) -> dict | None:
    """The retrieval fault of one method's phase: None for none or a method without retrieval.

    ``{"mode": ..., "how": what is done, for the report}``.
    """
    mode = getattr(args, "retrieval_fault", "none") or "none"
    if mode == "none" or "retrieval" not in files:
        return None
    how = {"killed": "retrieval node SIGKILLed at the window's start",
           "slow": f"retrieval_fault: answers after {getattr(args, 'fault_delay_s', 0.5):g} s",
           "empty": "retrieval_fault: answers at once, no candidates"}[mode]
    return {"mode": mode, "how": how}


def _spin_for(executor, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        executor.spin_once(timeout_sec=0.05)


# ------------------------------------------------------------------ heisd-bench sim-graph
def sim_phase_params(method: str, args, tmp: Path) -> dict[str, Path]:
    """Each sim-graph node's params file: its shipped YAML with the launch's overrides."""
    from heisd_ros.nodes.graph import launch_overrides, nodes_for, write_params_file

    arguments = {"method": method, "db": str(Path(args.db).resolve()) if args.db else "",
                 "task": args.task, "time_scale": str(args.time_scale),
                 "sim_mode": args.sim_mode}
    overrides = launch_overrides(arguments, sim=True)
    return {spec.name: write_params_file(tmp / f"{spec.name}.yaml", spec.name,
                                         overrides.get(spec.name, {}))
            for spec in nodes_for(sim=True)}


def start_sim_graph(children: NodeProcesses, files: dict, listener: GraphListener,
                    timeout_s: float) -> str:
    """Start the sim graph's nodes and wait for the first command; "" or what went wrong."""
    from heisd_ros.nodes.graph import nodes_for

    for spec in reversed(nodes_for(sim=True)):  # the sim first: its first reset is slow
        children.start(CHILD_NAMES[spec.name], spec.module, files[spec.name])
    deadline = time.monotonic() + timeout_s
    while not listener.commands:
        if children.died():
            return f"before the first command: {children.died()}"
        if time.monotonic() > deadline:
            return f"no command within {timeout_s:g} s"
        time.sleep(0.1)   # polling the children and the listener, spun on its own thread
    return ""


def run_sim_phase(method: str, args, tmp: Path, env: dict, context) -> dict:
    """One method: start the graph, wait for its first command, measure, stop; the raw data.

    Returns ``{"method", "error", "logs", ...}``; without an error also ``raw`` (for
    :func:`.sim_report.method_report`) and ``ready_after_s``.
    """
    phase_dir = tmp / method
    phase_dir.mkdir(parents=True, exist_ok=True)
    files = sim_phase_params(method, args, phase_dir)
    policy_cfg = ros_parameters(files["policy_node"])
    sim_cfg = ros_parameters(files["sim_node"])
    camera_period_s = 1.0 / (float(sim_cfg["third_person_rate_hz"])
                             * float(sim_cfg["time_scale"]))
    children = NodeProcesses(phase_dir, env)
    result: dict = {"method": method, "error": None, "logs": {}}
    listener = None
    try:
        # Spun on its own thread: this one only watches the children and the clock.
        listener = GraphListener.on_own_thread(context, f"sim_graph_{method}", cameras=True,
                                               robot_state=True, episodes=True)
        started = time.monotonic()
        result["error"] = start_sim_graph(children, files, listener, args.ready_timeout_s) or None
        result["logs"] = {k: str(v) for k, v in children.logs.items()}
        if result["error"]:
            return result
        result["ready_after_s"] = time.monotonic() - started
        ready_wall = time.time()
        deadline = time.monotonic() + 3.0  # a policy diagnostics sample from after the start
        while (listener.diagnostics_at.get(POLICY_DIAGNOSTICS, 0.0) < ready_wall
               and time.monotonic() < deadline):
            time.sleep(0.05)
        before = listener.diagnostics_of(POLICY_DIAGNOSTICS)
        t0 = time.time()
        end = time.monotonic() + args.duration_s
        while time.monotonic() < end:
            if children.died():
                result["error"] = f"during the measurement: {children.died()}"
                break
            time.sleep(0.1)
        t1 = time.time()
        after = listener.diagnostics_of(POLICY_DIAGNOSTICS)
        time.sleep(0.3)  # statuses and frames of the window's end still in flight
    finally:
        children.stop()
        if listener is not None:
            listener.close()
    sim_log = children.logs["sim"].read_text(errors="replace").splitlines()
    result["raw"] = {
        "window": [t0, t1], "commands": [(c.arrival_s, c.stamp_s) for c in listener.commands],
        "cameras": {k: list(listener.frames[k]) for k in CAMERAS},
        "states": list(listener.states), "statuses": [asdict(s) for s in listener.statuses],
        "hybrid": [(s.arrival_s, s.total_ms, s.unverified) for s in listener.steps],
        "policy_before": before, "policy_after": after,
        "sim_lines": sim_log, "min_period_s": float(policy_cfg.get("min_period_s", 0.0)),
        "camera_period_s": camera_period_s}
    return result
