"""A PiperRobot wired to an EmulatedPiper in-process: dry runs without an arm, and tests.

with emulated_piper_robot(start_enabled=True) as (arm_emulator, robot):
    state = robot.observe()          # real piper_sdk parsing emulated CAN frames
    robot.act(EETarget(...))         # real piper_sdk frames moving the emulated arm
    arm_emulator.inject_collision(3) # and back comes RobotFault.COLLISION
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from heisd_ros.robot.emulated_piper import EmulatedPiper, EmulatedPiperConfig
from heisd_ros.robot.piper import PiperConfig, PiperRobot

_counter = itertools.count()


def unique_channel(prefix: str = "heisd-piper") -> str:
    """A virtual-bus channel name not used before in this process.

    piper_sdk keeps one interface object per channel name for the whole process, so every
    emulated arm needs its own name.
    """
    return f"{prefix}-{os.getpid()}-{next(_counter)}"


@contextmanager
def emulated_piper_robot(
    emulator: EmulatedPiperConfig | None = None,
    robot: PiperConfig | None = None,
    start_enabled: bool = False,
) -> Iterator[tuple[EmulatedPiper, PiperRobot]]:
    """Start an emulated PIPER on a fresh virtual channel and a connected PiperRobot on it.

    ``emulator`` / ``robot`` override defaults; their channel fields are replaced by a fresh
    virtual channel. ``start_enabled`` enables the emulated motors and gripper at start-up.
    """
    channel = unique_channel()
    emu_config = replace(
        emulator or EmulatedPiperConfig(channel=channel), channel=channel, interface="virtual"
    )
    if start_enabled:
        emu_config = replace(emu_config, start_enabled=True)
    robot_config = replace(
        robot or PiperConfig(), can_channel=channel, interface="virtual", check_can_port=False
    )
    with EmulatedPiper(emu_config) as arm_emulator:
        piper = PiperRobot(robot_config)
        piper.connect()
        try:
            yield arm_emulator, piper
        finally:
            piper.disconnect()
