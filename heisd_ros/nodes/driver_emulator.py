"""Fault injection into the driver node's in-process emulated PIPER (only with ``emulate:=true``).

Services, under the driver node's private namespace:

- ``~/emulator/set_can_link`` (std_srvs/SetBool): false = the cable is pulled, no frames in
  either direction;
- ``~/emulator/inject_collision`` (std_srvs/Trigger): collision protection on joint 1;
- ``~/emulator/clear_faults`` (std_srvs/Trigger): clears injected faults and the emergency
  stop (unlike the real arm's reset it leaves the motors enabled).
"""

from __future__ import annotations

from collections.abc import Callable

from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.node import Node
from std_srvs.srv import SetBool, Trigger

from heisd_ros.robot.emulated_piper import EmulatedPiper


def create_emulator_services(node: Node, emulator: EmulatedPiper) -> None:
    """Create the fault-injection services of ``emulator`` on ``node``; each answer is logged."""
    group = MutuallyExclusiveCallbackGroup()  # the emulator has its own lock

    def on_set_can_link(request: SetBool.Request, response: SetBool.Response):
        emulator.set_can_link(request.data)
        response.success = True
        response.message = (
            "emulated CAN link up" if request.data else "emulated CAN link cut (cable pulled)"
        )
        node.get_logger().warning(f"emulator: {response.message}")
        return response

    def trigger(action: Callable[[EmulatedPiper], None], what: str):
        def handler(_request: Trigger.Request, response: Trigger.Response):
            action(emulator)
            node.get_logger().warning(f"emulator: {what}")
            response.success, response.message = True, what
            return response

        return handler

    node.create_service(
        SetBool, "~/emulator/set_can_link", on_set_can_link, callback_group=group
    )
    node.create_service(
        Trigger,
        "~/emulator/inject_collision",
        trigger(lambda emu: emu.inject_collision(1), "collision on joint 1"),
        callback_group=group,
    )
    node.create_service(
        Trigger,
        "~/emulator/clear_faults",
        trigger(lambda emu: emu.clear_faults(), "emulated faults and emergency stop cleared"),
        callback_group=group,
    )
