"""Safety filter: box, step and speed limits always hold; bad commands and gaps are refused."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heisd_ros.geometry.rotations import rotation_angle, rpy_to_matrix
from heisd_ros.robot.base import CommandMode, EECommand, EETarget
from heisd_ros.robot.command_stream import StepEvent, classify_step
from heisd_ros.robot.safety import MAX_RELEASE_INTERVAL_S, Admission, SafetyConfig, SafetyFilter

CONFIG = SafetyConfig()
LO, HI = np.array(CONFIG.workspace_min_m), np.array(CONFIG.workspace_max_m)
EPS = 1e-9

inside = st.tuples(*(st.floats(lo, hi) for lo, hi in zip(LO, HI, strict=True)))
rpy = st.tuples(st.floats(-math.pi, math.pi), st.floats(-1.5, 1.5), st.floats(-math.pi, math.pi))
vec = st.tuples(*(st.floats(-2.0, 2.0),) * 3)
command = st.builds(
    lambda t, r, mode: (t, r, mode),
    vec,
    st.tuples(*(st.floats(-math.pi, math.pi),) * 3),
    st.sampled_from(list(CommandMode)),
)


def _cmd(translation, rotation, mode=CommandMode.DELTA, step=1, **kwargs) -> EECommand:
    return EECommand(translation, rotation, mode=mode, step_index=step, **kwargs)


@settings(max_examples=300, deadline=None)
@given(start=inside, start_rpy=rpy, commands=st.lists(command, min_size=1, max_size=15))
def test_outputs_stay_in_the_box_and_within_step_limits(start, start_rpy, commands):
    safety = SafetyFilter(CONFIG)
    safety.reset(np.array(start), np.array(start_rpy), now_s=0.0)
    for i, (translation, rotation, mode) in enumerate(commands, start=1):
        before = safety.reference
        result = safety.filter(_cmd(translation, rotation, mode, step=i), now_s=0.1 * i)
        assert result.accepted, result.reason
        target = result.target
        assert np.all(target.position_m >= LO - EPS) and np.all(target.position_m <= HI + EPS)
        assert (
            np.linalg.norm(target.position_m - before.position_m)
            <= CONFIG.max_step_translation_m + EPS
        )
        angle = rotation_angle(rpy_to_matrix(before.rpy_rad), rpy_to_matrix(target.rpy_rad))
        assert angle <= CONFIG.max_step_rotation_rad + 1e-6
        # The next delta starts from what was commanded.
        assert np.allclose(safety.reference.position_m, target.position_m)


@settings(max_examples=200, deadline=None)
@given(
    start=inside,
    dp=st.tuples(*(st.floats(-0.011, 0.011),) * 3),
    dr=st.tuples(*(st.floats(-0.08, 0.08),) * 3),
)
def test_small_deltas_pass_unchanged_from_the_last_commanded_pose(start, dp, dr):
    start_rpy = np.array([math.pi, 1.2, 0.3])  # pitch near the PIPER's home (85 deg)
    safety = SafetyFilter(CONFIG)
    safety.reset(np.array(start), start_rpy, now_s=0.0)
    result = safety.filter(_cmd(dp, dr), now_s=0.1)
    expected = np.array(start) + np.array(dp)
    if np.all(expected >= LO) and np.all(expected <= HI):
        assert result.clamped == ()
        assert np.allclose(result.target.position_m, expected, atol=1e-12)
    # Delta rotation about the fixed base axes: R_new = R(d) @ R_last.
    assert (
        rotation_angle(
            rpy_to_matrix(dr) @ rpy_to_matrix(start_rpy), rpy_to_matrix(result.target.rpy_rad)
        )
        < 1e-9
    )


def test_absolute_target_is_approached_step_by_step():
    safety = SafetyFilter(CONFIG)
    safety.reset(np.array([0.2, 0.0, 0.3]), np.array([0.0, 1.4, 0.0]), now_s=0.0)
    goal, goal_rpy = np.array([0.3, 0.1, 0.2]), np.array([0.2, 1.2, -0.3])
    for step in range(1, 30):
        result = safety.filter(
            _cmd(goal, goal_rpy, CommandMode.ABSOLUTE, step=step), now_s=step * 0.1
        )
    assert np.allclose(result.target.position_m, goal) and result.clamped == ()
    assert rotation_angle(rpy_to_matrix(goal_rpy), rpy_to_matrix(result.target.rpy_rad)) < 1e-9


def test_workspace_clamp_is_reported_per_axis():
    safety = SafetyFilter(CONFIG)
    safety.reset(np.array([0.2, 0.0, HI[2] - 0.005]), np.zeros(3), now_s=0.0)
    result = safety.filter(_cmd([0, 0, 0.015], [0, 0, 0]), now_s=0.1)
    assert result.accepted and "workspace_z_max" in result.clamped
    assert result.target.position_m[2] == pytest.approx(HI[2])


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("where", range(6))
def test_non_finite_commands_are_rejected_and_change_nothing(bad, where):
    safety = SafetyFilter(CONFIG)
    safety.reset(np.array([0.2, 0.0, 0.3]), np.zeros(3), now_s=0.0)
    values = [0.0] * 6
    values[where] = bad
    result = safety.filter(_cmd(values[:3], values[3:]), now_s=0.1)
    assert not result.accepted and result.target is None
    assert "non-finite" in result.reason
    assert np.allclose(safety.reference.position_m, [0.2, 0.0, 0.3])
    assert safety.watchdog_expired(now_s=0.0 + CONFIG.watchdog_timeout_s + 0.01)  # not fed


def test_duplicate_step_and_foreign_frame_are_rejected():
    safety = SafetyFilter(CONFIG)
    safety.reset(np.array([0.2, 0.0, 0.3]), np.zeros(3), now_s=0.0)
    assert safety.filter(_cmd([0.01, 0, 0], [0, 0, 0], step=4), now_s=0.1).accepted
    dup = safety.filter(_cmd([0.01, 0, 0], [0, 0, 0], step=4), now_s=0.2)
    assert not dup.accepted and "duplicate step_index 4" in dup.reason
    assert np.allclose(safety.reference.position_m, [0.21, 0.0, 0.3])  # the delta ran once
    foreign = safety.filter(_cmd([0.01, 0, 0], [0, 0, 0], step=5, frame_id="camera"), now_s=0.3)
    assert not foreign.accepted and "camera" in foreign.reason


def test_watchdog_expires_without_accepted_commands():
    safety = SafetyFilter(SafetyConfig(watchdog_timeout_s=0.5))
    safety.reset(np.array([0.2, 0.0, 0.3]), np.zeros(3), now_s=10.0)
    assert not safety.watchdog_expired(10.4)
    assert safety.watchdog_expired(10.51)
    assert safety.filter(_cmd([0, 0, 0.001], [0, 0, 0]), now_s=10.6).accepted
    assert not safety.watchdog_expired(11.0)
    assert safety.watchdog_expired(11.2)
    safety.feed_watchdog(11.3)
    assert not safety.watchdog_expired(11.7)


def test_reset_outside_the_box_fails_with_advice():
    safety = SafetyFilter(CONFIG)
    with pytest.raises(ValueError, match="outside the workspace box"):
        safety.reset(np.array([0.2, 0.0, 0.01]), np.zeros(3), now_s=0.0)
    with pytest.raises(RuntimeError, match="reset"):
        safety.filter(_cmd([0, 0, 0], [0, 0, 0]), now_s=0.0)


@pytest.mark.parametrize(
    ("kwargs", "field_name"),
    [
        ({"workspace_min_m": (0.0, 0.0)}, "workspace_min_m"),
        ({"workspace_max_m": (0.5, 0.35, 0.05)}, "workspace_max_m"),
        ({"max_step_translation_m": 0.0}, "max_step_translation_m"),
        ({"max_step_rotation_rad": math.nan}, "max_step_rotation_rad"),
        ({"max_step_rotation_rad": 4.0}, "max_step_rotation_rad"),
        ({"watchdog_timeout_s": -1.0}, "watchdog_timeout_s"),
        ({"max_linear_speed_m_s": -0.1}, "max_linear_speed_m_s"),
        ({"max_angular_speed_rad_s": math.inf}, "max_angular_speed_rad_s"),
    ],
)
def test_config_rejects_bad_values_naming_the_field(kwargs, field_name):
    with pytest.raises(ValueError, match=field_name):
        SafetyConfig(**kwargs)


# --- the step-index stream -----------------------------------------------------------------


def test_classify_step_tells_next_duplicate_gap_and_restart():
    assert classify_step(None, 7) == (StepEvent.FIRST, 0)
    assert classify_step(7, 8) == (StepEvent.NEXT, 0)
    assert classify_step(7, 7) == (StepEvent.DUPLICATE, 0)
    assert classify_step(7, 10) == (StepEvent.GAP, 2)
    assert classify_step(7, 0) == (StepEvent.RESTART, 0)


def test_a_gap_refuses_the_command_and_re_anchors_to_the_measured_pose():
    safety = SafetyFilter(CONFIG)
    safety.reset(np.array([0.2, 0.0, 0.3]), np.zeros(3), now_s=0.0)
    assert safety.filter(_cmd([0.01, 0, 0], [0, 0, 0], step=1), now_s=0.1).accepted
    measured = EETarget(np.array([0.205, 0.001, 0.3]), np.array([0.0, 0.0, 0.02]))
    gap = safety.filter(_cmd([0.01, 0, 0], [0, 0, 0], step=4), now_s=0.2, measured=measured)
    assert not gap.accepted and "2 command(s) lost" in gap.reason
    # Requested and released pose are where the arm is, not where the partial stream leads.
    assert np.allclose(safety.reference.position_m, measured.position_m)
    assert np.allclose(safety.target.rpy_rad, measured.rpy_rad)
    nxt = safety.filter(_cmd([0.0, 0.01, 0], [0, 0, 0], step=5), now_s=0.3, measured=measured)
    assert nxt.accepted and np.allclose(nxt.target.position_m, [0.205, 0.011, 0.3])


def test_a_step_index_going_backwards_starts_a_new_stream_from_the_measured_pose():
    safety = SafetyFilter(CONFIG)
    safety.reset(np.array([0.2, 0.0, 0.3]), np.zeros(3), now_s=0.0)
    for step in (40, 41):
        assert safety.filter(_cmd([0.01, 0, 0], [0, 0, 0], step=step), now_s=0.1).accepted
    measured = EETarget(np.array([0.215, 0.0, 0.3]), np.zeros(3))  # the arm lags behind
    admission = safety.admit(_cmd([0, 0, 0.01], [0, 0, 0], step=0), measured)
    assert admission == Admission("", StepEvent.RESTART, 0, True)
    result = safety.limit(_cmd([0, 0, 0.01], [0, 0, 0], step=0), now_s=0.2)
    assert result.accepted and np.allclose(result.target.position_m, [0.215, 0.0, 0.31])


def test_with_gap_handling_off_every_index_continues_the_stream():
    safety = SafetyFilter(
        SafetyConfig(reanchor_on_step_gap=False, reject_duplicate_step_index=False)
    )
    safety.reset(np.array([0.2, 0.0, 0.3]), np.zeros(3), now_s=0.0)
    for step in (1, 5, 5, 2):  # gap, duplicate, backwards: all integrated
        assert safety.filter(_cmd([0.01, 0, 0], [0, 0, 0], step=step), now_s=0.1).accepted
    assert np.allclose(safety.reference.position_m, [0.24, 0.0, 0.3])


# --- speed limits ----------------------------------------------------------------------------

SPEEDY = SafetyConfig(max_linear_speed_m_s=0.25, max_angular_speed_rad_s=1.5)
small = st.tuples(*(st.floats(-0.03, 0.03),) * 3)
turns = st.tuples(*(st.floats(-0.2, 0.2),) * 3)


@settings(max_examples=200, deadline=None)
@given(
    stream=st.lists(
        st.tuples(small, turns, st.floats(0.0, 0.05), st.booleans()), min_size=1, max_size=40
    )
)
def test_the_released_target_never_outruns_the_speed_limits(stream):
    """Commands and ticks at random times: every release moves within speed x elapsed time."""
    safety = SafetyFilter(SPEEDY)
    safety.reset(np.array([0.25, 0.0, 0.3]), np.array([math.pi, 1.2, 0.3]), now_s=0.0)
    now, step = 0.0, 0
    previous = safety.target
    for translation, rotation, dt, is_tick in stream:
        last = now
        now += dt
        if is_tick:
            target = safety.release(now) or safety.target
        else:
            step += 1
            target = safety.filter(_cmd(translation, rotation, step=step), now_s=now).target
        allowed = min(now - last, MAX_RELEASE_INTERVAL_S)
        moved = np.linalg.norm(target.position_m - previous.position_m)
        assert moved <= SPEEDY.max_linear_speed_m_s * allowed + 1e-9
        turned = rotation_angle(rpy_to_matrix(previous.rpy_rad), rpy_to_matrix(target.rpy_rad))
        assert turned <= SPEEDY.max_angular_speed_rad_s * allowed + 1e-6
        # The request never runs more than one step ahead of the release.
        lead = np.linalg.norm(safety.reference.position_m - target.position_m)
        assert lead <= SPEEDY.max_step_translation_m + 1e-9
        previous = target


def test_a_fast_net_zero_stream_is_delayed_not_reshaped():
    """+-1 cm every millisecond: the release crawls, and ends exactly where it started."""
    safety = SafetyFilter(SPEEDY)
    start = np.array([0.25, 0.0, 0.3])
    safety.reset(start, np.zeros(3), now_s=0.0)
    for step in range(1, 201):
        result = safety.filter(
            _cmd([0.01 if step % 2 else -0.01, 0, 0], [0, 0, 0], step=step), now_s=step * 1e-3
        )
        assert result.accepted and result.clamped == ()  # slowed down, nothing dropped
        assert np.linalg.norm(result.target.position_m - start) <= 0.01 + 1e-12
    now = 0.2
    while safety.pending:  # the control ticks release the rest
        now += 0.02
        safety.release(now)
    assert np.array_equal(safety.target.position_m, start)


def test_a_stream_faster_than_the_limit_drops_the_excess_beyond_one_step():
    safety = SafetyFilter(SPEEDY)
    safety.reset(np.array([0.1, 0.0, 0.3]), np.zeros(3), now_s=0.0)
    for step in range(1, 11):  # 10 x 2 cm within 10 ms: 20 m/s asked
        result = safety.filter(_cmd([0.02, 0, 0], [0, 0, 0], step=step), now_s=step * 1e-3)
    assert "speed_lead" in result.clamped
    released = safety.target.position_m[0]
    assert released == pytest.approx(0.1 + 0.25 * 0.01)  # 2.5 mm in 10 ms
    lead = safety.reference.position_m[0] - released
    assert 0.019 < lead <= 0.02  # about one step ahead, the rest dropped
    safety.stop(now_s=0.02)  # a hold: what was not released is dropped
    assert not safety.pending and safety.reference.position_m[0] == pytest.approx(released)
