"""The policy node's input gate (pure Python: pairing, freshness, malformed input)."""

from __future__ import annotations

import numpy as np
import pytest

from heisd_ros.nodes.policy_inputs import GateResult, InputGate, InputGateConfig, RobotInput

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
    (dict(dt=0.1), "unpaired frames"),  # the wrist camera has passed the frame
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
        assert waiting.snapshot is None
        if waiting.problem:  # only a wrist camera whose newest frame is stale is reported
            assert refused_case == dict(t=5.0) and waiting.problem.startswith(
                "stale frames: the newest wrist frame"), waiting.problem
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


def fresh_gate():
    gate = InputGate(InputGateConfig(pair_tolerance_s=0.05, max_age_s=0.3, max_future_s=0.05))
    gate.add_robot(robot(0.0))
    return gate


def frame(value):
    return np.full((16, 16, 3), value, np.uint8)


def test_a_30_hz_camera_with_a_10_hz_wrist_reuses_wrist_frames():
    """A wrist frame serves every third-person frame within 50 ms of it.

    A frame whose nearest wrist frame has not arrived (67 ms to the last, 33 ms to the next)
    waits, and is passed over when the next frame pairs: the node acts on the newest.
    """
    gate, taken = fresh_gate(), {}
    for k in range(12):  # 0.4 s of a 30 Hz camera; the wrist every 100 ms
        t = k / 30
        if k % 3 == 0:
            gate.add_frame("wrist", t, frame(k // 3))
        gate.add_frame("third_person", t, frame(k))
        gate.add_robot(robot(t))
        result = gate.take(now_s=t + 0.002)
        assert not result.problem, (k, result.problem)
        if result.snapshot is not None:
            taken[int(result.snapshot.third_person[0, 0, 0])] = int(result.snapshot.wrist[0, 0, 0])
    assert taken == {0: 0, 1: 0, 3: 1, 4: 1, 6: 2, 7: 2, 9: 3, 10: 3}


def test_a_wrist_frame_stamped_later_is_waited_for_then_paired():
    gate = fresh_gate()
    gate.add_frame("wrist", 0.9, frame(9))
    gate.add_frame("third_person", 1.0, frame(10))
    gate.add_robot(robot(1.0))
    waiting = gate.take(1.005)
    assert waiting.snapshot is None and not waiting.problem  # its partner may be on its way
    gate.add_frame("wrist", 1.01, frame(10))
    result = gate.take(1.02)
    assert result.snapshot.wrist[0, 0, 0] == 10 and result.snapshot.stamp_s == 1.01


def test_the_nearest_wrist_frame_held_is_chosen_in_either_order():
    gate = fresh_gate()
    for stamp, value in ((0.96, 1), (1.02, 2)):
        gate.add_frame("wrist", stamp, frame(value))
    gate.add_frame("third_person", 1.0, frame(0))
    gate.add_robot(robot(1.0))
    assert gate.take(1.03).snapshot.wrist[0, 0, 0] == 2  # 20 ms after beats 40 ms before
    gate.add_frame("third_person", 1.05, frame(0))  # 30 ms after 1.02: the earlier one
    assert gate.take(1.06).snapshot.wrist[0, 0, 0] == 2


def test_an_older_frame_with_a_partner_is_taken_while_the_newest_waits():
    """A wrist camera whose messages arrive late: the gate acts on what it can pair."""
    gate = fresh_gate()
    gate.add_frame("third_person", 1.0, frame(1))
    gate.add_frame("third_person", 1.08, frame(2))
    gate.add_frame("wrist", 1.0, frame(1))
    gate.add_robot(robot(1.0))
    assert gate.take(1.085).snapshot.third_person[0, 0, 0] == 1
    waiting = gate.take(1.09)
    assert waiting.snapshot is None and not waiting.problem
    gate.add_frame("wrist", 1.08, frame(2))
    assert gate.take(1.1).snapshot.third_person[0, 0, 0] == 2


def test_a_stale_wrist_camera_is_reported_once_and_the_frame_still_pairs_after():
    gate = fresh_gate()
    gate.add_frame("wrist", 1.0, frame(1))
    gate.add_frame("third_person", 2.0, frame(2))
    gate.add_robot(robot(2.0))
    # just in: its partner is likely on its way (the cameras publish one after the other)
    assert gate.take(2.01) == GateResult()
    first = gate.take(2.06)  # waited longer than the pair tolerance (0.05 s)
    assert first.kind == "stale frames" and "wrist" in first.problem, first.problem
    assert not gate.take(2.07).problem  # once
    gate.add_frame("wrist", 2.03, frame(3))  # stamped within the tolerance, arrived late
    assert gate.take(2.07).snapshot is not None


def test_a_partner_that_comes_right_after_a_long_pause_is_no_hold():
    """A lockstep sim: minutes-old wrist frame, then both new frames one after the other."""
    gate = fresh_gate()
    gate.add_frame("wrist", 1.0, frame(1))
    gate.add_frame("third_person", 3.0, frame(2))
    gate.add_robot(robot(3.0))
    assert gate.take(3.001) == GateResult()  # no refusal: nothing is held
    gate.add_frame("wrist", 3.0, frame(2))
    assert gate.take(3.002).snapshot is not None


def test_a_frame_without_a_partner_is_refused_as_unpaired_once_it_is_stale():
    gate = fresh_gate()
    gate.add_frame("wrist", 0.9, frame(0))
    gate.add_frame("third_person", 1.0, frame(1))
    gate.add_robot(robot(1.0))
    for now in (1.01, 1.2):
        result = gate.take(now)
        assert result.snapshot is None and not result.problem  # still waiting for a partner
    result = gate.take(1.31)
    assert result.kind == "unpaired frames" and "nearest 0.100 s away" in result.problem
    assert not gate.take(1.32).problem  # once


def test_a_late_stale_frame_older_than_the_last_one_used_is_reported_once():
    gate = gate_with()
    assert gate.take(10.1).snapshot is not None
    gate.add_frame("third_person", 7.0, IMG)  # older than the frame used, and stale
    assert gate.take(10.2).kind == "stale frames"
    assert not gate.take(10.21).problem  # once
