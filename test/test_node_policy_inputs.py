"""The policy node's input gate (pure Python: pairing, freshness, malformed input)."""

from __future__ import annotations

import numpy as np
import pytest

from heisd_ros.nodes.policy_inputs import InputGate, InputGateConfig, RobotInput

IMG = np.zeros((16, 16, 3), np.uint8)


def robot(stamp, joints=0.1):
    return RobotInput(stamp, np.full(6, joints), 0.07, np.array([0.3, 0.0, 0.3]), np.zeros(3))


def gate_with(t=10.0, third=IMG, wrist=IMG, dt=0.0, state=None):
    gate = InputGate(InputGateConfig(pair_tolerance_s=0.05, max_age_s=0.5, max_future_s=0.05))
    gate.add_frame("third_person", t, third)
    gate.add_frame("wrist", t + dt, wrist)
    gate.add_robot(state if state is not None else robot(t))
    return gate


def test_a_good_pair_is_taken_once():
    gate = gate_with()
    result = gate.take(now_s=10.1)
    assert result.snapshot is not None and result.snapshot.stamp_s == 10.0
    assert not result.problem
    again = gate.take(now_s=10.1)
    assert again.snapshot is None and not again.problem  # nothing new: wait, silently
    gate.add_frame("third_person", 10.2, IMG)
    assert gate.take(10.25).snapshot is None  # the wrist has nothing new yet
    gate.add_frame("wrist", 10.21, IMG)
    assert gate.take(10.25).snapshot.stamp_s == pytest.approx(10.21)


@pytest.mark.parametrize("case,kind", [
    (dict(dt=-0.2), "unpaired frames"),
    (dict(t=20.0), "frame from the future"),
    (dict(t=5.0), "stale frames"),
    (dict(wrist=np.zeros((8, 16, 3), np.uint8)), "mismatched image sizes"),
    (dict(state=robot(10.0, joints=np.nan)), "NaN in the robot state"),
    (dict(state=robot(3.0)), "stale robot state"),
])
def test_refusals_are_named(case, kind):
    result = gate_with(**case).take(now_s=10.1)
    assert result.snapshot is None
    assert result.kind == kind, result.problem


def test_a_malformed_newest_frame_blocks_the_camera():
    gate = gate_with()
    gate.add_frame("wrist", 10.05, None, "unsupported image encoding 'rgba8'")
    result = gate.take(10.1)
    assert result.snapshot is None
    assert result.kind == "malformed wrist image" and "rgba8" in result.problem


def test_the_gate_rejects_bad_settings():
    with pytest.raises(ValueError, match="max_age_s"):
        InputGateConfig(max_age_s=0.0)
    with pytest.raises(ValueError, match="camera"):
        InputGate().add_frame("left", 0.0, IMG)


def test_after_a_refused_pair_the_next_good_pair_is_taken():
    """Whatever order the cameras deliver in, one bad pair never blocks the next good one."""
    for refused_case in (dict(t=20.0), dict(t=5.0), dict(state=robot(10.0, joints=np.nan)),
                         dict(wrist=np.zeros((8, 16, 3), np.uint8))):
        gate = gate_with(**refused_case)
        assert gate.take(10.1).problem
        gate.add_robot(robot(10.2))
        gate.add_frame("third_person", 10.2, IMG)
        waiting = gate.take(10.21)  # the wrist has nothing new since the refused pair
        assert waiting.snapshot is None and not waiting.problem, waiting.problem
        gate.add_frame("wrist", 10.2, IMG)
        result = gate.take(10.22)
        assert result.snapshot is not None, (refused_case, result.problem)


@pytest.mark.parametrize("order", [("third_person", "wrist"), ("wrist", "third_person")])
def test_future_frames_arriving_one_by_one_never_block_the_good_pair_after_them(order):
    """Frames that arrive one by one, with a take between them, still give the good pair.

    This is the node's real timing; it must hold whichever camera comes first.
    """
    gate = gate_with()
    assert gate.take(10.01).snapshot is not None
    first, second = order
    gate.add_frame(first, 20.0, IMG)
    assert gate.take(10.1).kind == "frame from the future"
    gate.add_frame(second, 20.0, IMG)
    refused = gate.take(10.11)
    assert refused.kind == "frame from the future" and second in refused.problem
    assert not gate.take(10.12).problem  # each future frame is reported once
    gate.add_robot(robot(10.2))
    gate.add_frame(first, 10.2, IMG)
    waiting = gate.take(10.21)
    assert waiting.snapshot is None and not waiting.problem, waiting.problem
    gate.add_frame(second, 10.2, IMG)
    assert gate.take(10.22).snapshot is not None


def test_a_new_episode_waits_for_frames_taken_after_it_started():
    gate = gate_with()
    gate.reset()  # the frames held show the scene before the episode started
    assert gate.take(now_s=10.1).snapshot is None
    gate.add_frame("third_person", 10.2, IMG)
    assert gate.take(now_s=10.25).snapshot is None  # the wrist has nothing new yet
    gate.add_frame("wrist", 10.21, IMG)
    assert gate.take(now_s=10.25).snapshot.stamp_s == pytest.approx(10.21)
    gate.reset()  # and a new episode may restart at older stamps (a restarted sim clock)
    gate.add_frame("third_person", 1.0, IMG)
    gate.add_frame("wrist", 1.0, IMG)
    gate.add_robot(robot(1.0))
    assert gate.take(now_s=1.1).snapshot.stamp_s == 1.0


def test_frames_stamped_from_the_episode_start_count_for_it():
    gate = gate_with(t=10.0)
    assert gate.take(now_s=10.1).snapshot is not None
    gate.add_frame("third_person", 10.5, IMG)  # the new episode's frames overtook its status
    gate.add_frame("wrist", 10.5, IMG)
    gate.add_robot(robot(10.5))
    gate.reset(since_s=10.5)
    assert gate.take(now_s=10.6).snapshot.stamp_s == 10.5
    gate.reset(since_s=10.5)  # the same start again (a late status): nothing is used twice
    assert gate.take(now_s=10.6).snapshot is None
    gate.add_frame("third_person", 10.4, IMG)  # an old frame is no frame of the episode
    gate.add_frame("wrist", 10.7, IMG)
    gate.reset(since_s=10.6)
    assert gate.take(now_s=10.8).snapshot is None
