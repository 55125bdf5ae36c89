"""The main job on the embedded default (``make demo``).

Today: a self-check of the built package (the interfaces cross real DDS in-process). The
closed-loop simulator demo comes with the evaluation tooling.

Example:
    python -m heisd_ros.tools.demo
"""

from __future__ import annotations

import sys
import time


def _dds_self_check(timeout_s: float = 10.0) -> str:
    """Publish one EECommand and receive it over DDS; return a one-line result."""
    import rclpy
    from rclpy.executors import SingleThreadedExecutor

    from heisd_ros.msg import EECommand

    context = rclpy.Context()
    rclpy.init(context=context)
    try:
        node = rclpy.create_node("heisd_demo_self_check", context=context)
        got: list[EECommand] = []
        node.create_subscription(EECommand, "/heisd_demo/ee_command", got.append, 10)
        pub = node.create_publisher(EECommand, "/heisd_demo/ee_command", 10)
        executor = SingleThreadedExecutor(context=context)
        executor.add_node(node)
        sent = EECommand(step_index=1, gripper=EECommand.GRIPPER_CLOSED)
        sent.translation_m.x = 0.01
        deadline = time.monotonic() + timeout_s
        while not got and time.monotonic() < deadline:
            pub.publish(sent)
            executor.spin_once(timeout_sec=0.1)
        executor.shutdown()
        node.destroy_node()
        return "ok" if got and got[0] == sent else f"no message within {timeout_s} s"
    finally:
        rclpy.shutdown(context=context)


def main() -> int:
    """Run the self-check and print what is installed; exit 1 when the check fails."""
    try:
        result = _dds_self_check()
    except ImportError as exc:
        result = f"ROS 2 or the built interfaces are missing ({exc}); run scripts/setup.sh"
    print(f"interfaces over DDS: {result}")
    print("The closed-loop demo (simulated PIPER, small VLA, AR vs HeiSD table and report) is not "
          "implemented yet; see README.md, 'What make demo does today'.")
    return 0 if result == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
