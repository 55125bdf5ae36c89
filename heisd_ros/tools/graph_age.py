"""Command age in the running graph: 30 Hz cameras, policy node, PIPER driver as processes.

Starts the policy node (shipped small VLA and draft head) and the PIPER driver (emulated arm on
python-can's virtual bus, real piper_sdk) as their own processes on a private DDS domain. This
process plays the cameras: both publish frames at ``--camera-hz`` stamped when taken, like a
camera driver. It listens to /heisd/ee_command beside the driver and reads the driver's
/diagnostics, then reports the command rate and the age of every command when it arrived
(arrival time - header.stamp, the stamp being the frames' time), against the policy's
``max_command_age_s`` and the driver's ``max_command_age_s``.

Example (after ``source .heisd-env.sh``)::

    python -m heisd_ros.tools.graph_age --duration-s 60 --json runs/graph_age.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

from heisd_ros.nodes.graph import write_params_file

ASSETS = Path(__file__).resolve().parents[1] / "assets"


def _start(module: str, params: Path, tmp: Path, env: dict) -> subprocess.Popen:
    log = open(tmp / f"{module.rsplit('.', 1)[-1]}.log", "w")  # noqa: SIM115 - kept open
    return subprocess.Popen([sys.executable, "-m", module, "--ros-args", "--params-file",
                             str(params)], stdout=log, stderr=subprocess.STDOUT, env=env,
                            cwd=tmp)


def main(argv=None) -> int:
    """Run the graph for ``--duration-s`` and report; exit 1 when no command arrived."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--duration-s", type=float, default=60.0)
    p.add_argument("--camera-hz", type=float, default=30.0)
    p.add_argument("--image-px", type=int, default=224)
    p.add_argument("--method", default="drafter")
    p.add_argument("--json", default=None, help="write the figures here")
    args = p.parse_args(argv)

    from heisd_ros.testing.domains import allocate_domain

    domain = allocate_domain()  # held for this process: no test or other tool shares it
    os.environ["ROS_DOMAIN_ID"] = str(domain)
    env = dict(os.environ)
    tmp = Path(tempfile.mkdtemp(prefix="heisd_graph_age_"))
    assets = ASSETS
    policy_params = write_params_file(tmp / "policy_node.yaml", "policy_node", {
        "method": args.method, "instruction": "put the red block on the plate",
        "model.path": str(assets / "small_vla.safetensors"),
        "model.drafter_path": str(assets / "draft_head.safetensors")})
    driver_params = write_params_file(tmp / "piper_driver_node.yaml", "piper_driver_node", {
        "emulate": True, "interface": "virtual", "enable_on_start": True})
    procs = [_start("heisd_ros.nodes.piper_driver_node", driver_params, tmp, env),
             _start("heisd_ros.nodes.policy_node", policy_params, tmp, env)]

    import rclpy
    from diagnostic_msgs.msg import DiagnosticArray
    from rclpy.executors import SingleThreadedExecutor
    from sensor_msgs.msg import Image

    from heisd_ros.msg import EECommand
    from heisd_ros.nodes.image_conversion import rgb_to_image
    from heisd_ros.nodes.robot_msgs import stamp_to_seconds

    rclpy.init()
    node = rclpy.create_node("graph_command_age")
    ages_s: list[float] = []
    arrivals_s: list[float] = []
    diagnostics: dict[str, dict[str, str]] = {}

    def on_command(msg: EECommand) -> None:
        now = node.get_clock().now().nanoseconds * 1e-9
        arrivals_s.append(now)
        ages_s.append(now - stamp_to_seconds(msg.header.stamp))

    def on_diag(msg: DiagnosticArray) -> None:
        for status in msg.status:
            level = status.level if isinstance(status.level, int) else ord(status.level)
            diagnostics[status.name] = {"level": level, "message": status.message,
                                        **{kv.key: kv.value for kv in status.values}}

    node.create_subscription(EECommand, "/heisd/ee_command", on_command, 100)
    node.create_subscription(DiagnosticArray, "/diagnostics", on_diag, 50)
    cams = [node.create_publisher(Image, topic, 2) for topic in
            ("/camera/third_person/image_raw", "/camera/wrist/image_raw")]
    rng = np.random.default_rng(0)
    frames = [rgb_to_image(rng.integers(0, 255, (args.image_px, args.image_px, 3), np.uint8))
              for _ in range(2)]

    def publish_frames() -> None:
        stamp = node.get_clock().now().to_msg()
        for pub, frame in zip(cams, frames, strict=True):
            frame.header.stamp, frame.header.frame_id = stamp, "base_link"
            pub.publish(frame)

    node.create_timer(1.0 / args.camera_hz, publish_frames)
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    print(f"[graph] domain {domain}, logs in {tmp}; waiting for the first command", flush=True)
    start_deadline = time.monotonic() + 300.0
    while not ages_s and time.monotonic() < start_deadline:
        executor.spin_once(timeout_sec=0.1)
        if any(proc.poll() is not None for proc in procs):
            break
    if not ages_s:
        print("[graph] no command arrived; see the node logs", file=sys.stderr)
        code = 1
    else:
        ages_s.clear()
        arrivals_s.clear()
        end = time.monotonic() + args.duration_s
        while time.monotonic() < end:
            executor.spin_once(timeout_sec=0.1)
        code = 0
    for proc in procs:
        proc.send_signal(signal.SIGINT)
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
    node.destroy_node()
    rclpy.shutdown()
    if code:
        return code
    policy_limit = yaml.safe_load(policy_params.read_text())["/**"]["ros__parameters"][
        "max_command_age_s"]
    driver_cfg = yaml.safe_load(driver_params.read_text())["/**"]["ros__parameters"]
    driver_limit = driver_cfg.get("controller", {}).get("max_command_age_s")
    ages_ms = np.array(ages_s) * 1e3
    report = {
        "duration_s": args.duration_s, "camera_hz": args.camera_hz, "method": args.method,
        "commands": len(ages_ms), "command_rate_hz": len(ages_ms) / args.duration_s,
        "age_p50_ms": float(np.percentile(ages_ms, 50)),
        "age_p99_ms": float(np.percentile(ages_ms, 99)), "age_max_ms": float(ages_ms.max()),
        "policy_max_command_age_ms": policy_limit * 1e3,
        "driver_max_command_age_ms": None if driver_limit is None else driver_limit * 1e3,
        "over_policy_limit": int((ages_ms > policy_limit * 1e3).sum()),
        "over_driver_limit": None if driver_limit is None
        else int((ages_ms > driver_limit * 1e3).sum()),
        "driver": {k: v for k, v in diagnostics.get("piper_driver_node: controller", {}).items()
                   if k.startswith("commands_") or k == "last_rejected_reason"},
        "policy_refusals": {k: v for k, v in diagnostics.get("policy_node: policy", {}).items()
                            if k.startswith("refused[")},
        "diagnostics": diagnostics,
    }
    print(json.dumps({k: v for k, v in report.items() if k != "diagnostics"}, indent=2))
    for name, values in diagnostics.items():
        print(f"[diagnostics] {name}: level {values['level']}, {values['message']}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
