"""EECommand mirrors msg/EECommand.msg; records validate their fields."""

from __future__ import annotations

import math
import re
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from heisd_ros.robot.base import (
    CommandMode,
    CommandSource,
    EECommand,
    EETarget,
    GripperState,
    RobotFault,
    RobotState,
)

MSG = Path(__file__).resolve().parents[1] / "msg" / "EECommand.msg"


def _msg_constants() -> dict[str, int]:
    constants = {}
    for line in MSG.read_text().splitlines():
        match = re.match(r"\s*uint8\s+([A-Z_]+)\s*=\s*(\d+)", line)
        if match:
            constants[match.group(1)] = int(match.group(2))
    return constants


def test_constants_match_the_message_definition():
    constants = _msg_constants()
    assert len(constants) == 10  # 2 modes, 2 gripper states, 6 sources
    for name, value in constants.items():
        assert int(getattr(EECommand, name)) == value, name
    assert {f"MODE_{m.name}" for m in CommandMode} | {f"GRIPPER_{g.name}" for g in GripperState} | {
        f"SOURCE_{s.name}" for s in CommandSource
    } == set(constants)


def test_fields_cover_the_message_fields():
    msg_fields = set()
    for line in MSG.read_text().splitlines():
        match = re.match(r"\s*[\w/]+\s+([a-z_]+)\s*$", line.split("#")[0])
        if match:
            msg_fields.add(match.group(1))
    assert {
        "header",
        "step_index",
        "mode",
        "translation_m",
        "gripper_from_target",
        "source",
    } <= msg_fields
    ours = {f.name for f in fields(EECommand)}
    # header -> stamp_s + frame_id; everything else keeps its name.
    assert msg_fields - {"header"} <= ours
    assert {"stamp_s", "frame_id"} <= ours


def test_command_accepts_plain_ints_and_exposes_enums():
    cmd = EECommand(
        [0.01, 0, 0],
        (0, 0, 0.1),
        gripper=1,
        gripper_from_target=True,
        mode=0,
        source=3,
        step_index=7,
    )
    assert cmd.gripper is GripperState.CLOSED and cmd.mode is CommandMode.DELTA
    assert cmd.source is CommandSource.RETRIEVAL_SKIP
    assert cmd.translation_m.shape == (3,) and not cmd.translation_m.flags.writeable


@pytest.mark.parametrize(
    ("kwargs", "field_name"),
    [
        ({"gripper": 2}, "gripper"),
        ({"mode": 5}, "mode"),
        ({"source": 9}, "source"),
        ({"translation_m": [0.0, 0.0]}, "translation_m"),
        ({"rotation_rad": "abc"}, "rotation_rad"),
        ({"gripper_from_target": 1}, "gripper_from_target"),
        ({"step_index": -1}, "step_index"),
        ({"stamp_s": math.inf}, "stamp_s"),
    ],
)
def test_command_rejects_malformed_fields_naming_the_field(kwargs, field_name):
    base = {"translation_m": [0, 0, 0], "rotation_rad": [0, 0, 0]}
    with pytest.raises(ValueError, match=field_name):
        EECommand(**{**base, **kwargs})


def test_non_finite_commands_construct_but_report_it():
    cmd = EECommand([math.nan, 0, 0], [0, 0, 0])
    assert not cmd.is_finite
    assert EECommand([0, 0, 0], [0, 0, 0]).is_finite


def test_target_and_state_validate():
    with pytest.raises(ValueError, match="finite"):
        EETarget([0, 0, math.inf], [0, 0, 0])
    with pytest.raises(ValueError, match="gripper_width_m"):
        EETarget([0, 0, 0], [0, 0, 0], gripper_width_m=-0.01)
    with pytest.raises(ValueError, match="joint_positions_rad"):
        RobotState(0.0, np.zeros(5), 0.0, np.zeros(3), np.zeros(3))
    state = RobotState(
        0.0,
        np.zeros(6),
        0.0,
        np.zeros(3),
        np.zeros(3),
        motors_enabled=(True,) * 6,
        faults={"collision"},
    )
    assert state.enabled and not state.ok and RobotFault.COLLISION in state.faults
