"""Strict gripper: target-only changes, hysteresis, and the arm waits while the gripper moves."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heisd_ros.robot.base import CommandSource, GripperState
from heisd_ros.robot.gripper import DoneReason, GripperConfig, GripperPhase, GripperStateMachine

OPEN, CLOSED = GripperState.OPEN, GripperState.CLOSED
CONFIG = GripperConfig()

# One command's gripper part: (state, from_target flag, source).
gripper_cmd = st.tuples(
    st.sampled_from([OPEN, CLOSED]), st.booleans(), st.sampled_from(list(CommandSource))
)


def _settle(sm: GripperStateMachine, now_s: float) -> None:
    """Feedback that the gripper reached its target."""
    sm.feedback(sm.target_width_m, now_s)
    assert not sm.should_hold_arm()


@settings(max_examples=300, deadline=None)
@given(st.lists(gripper_cmd, max_size=40), st.sampled_from([OPEN, CLOSED]), st.integers(1, 4))
def test_changes_only_from_target_commands_after_n_in_a_row(commands, initial, hysteresis):
    sm = GripperStateMachine(GripperConfig(hysteresis_steps=hysteresis), initial)
    counted_run: list[
        GripperState
    ] = []  # reference model: the counted commands since the last change
    for i, (state, from_target, source) in enumerate(commands):
        before = sm.state
        decision = sm.command(state, from_target, now_s=float(i), source=source)
        counts = from_target and source != CommandSource.RETRIEVAL_SKIP
        if counts:
            counted_run.append(state)
        if decision.changed:
            assert counts, "a change came from a command the target VLA did not produce"
            assert sm.state == state != before
            assert len(counted_run) >= hysteresis and set(counted_run[-hysteresis:]) == {state}
            counted_run = []
            _settle(sm, float(i) + 0.5)
        else:
            assert sm.state == before
            if counts and len(counted_run) >= hysteresis:
                # Would have toggled in the model: only allowed when the run is not all "other".
                assert set(counted_run[-hysteresis:]) != {GripperState(1 - before)}


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.just([(OPEN, True)]),
            st.just([(CLOSED, True), (OPEN, True)]),  # a single-step flicker
            st.lists(
                st.tuples(st.sampled_from([OPEN, CLOSED]), st.just(False)), min_size=1, max_size=3
            ),
        ),
        max_size=20,
    )
)
def test_single_step_flicker_never_toggles_with_hysteresis_two(blocks):
    sm = GripperStateMachine(GripperConfig(hysteresis_steps=2), OPEN)
    for i, (state, from_target) in enumerate(cmd for block in blocks for cmd in block):
        assert not sm.command(state, from_target, now_s=float(i)).changed
        assert sm.state == OPEN and sm.phase == GripperPhase.IDLE


def test_skipped_draft_never_moves_the_gripper_even_if_flagged():
    sm = GripperStateMachine(GripperConfig(hysteresis_steps=1), OPEN)
    decision = sm.command(CLOSED, True, 0.0, source=CommandSource.RETRIEVAL_SKIP)
    assert not decision.changed and not decision.counted and sm.state == OPEN
    assert sm.command(CLOSED, True, 0.1, source=CommandSource.RETRIEVAL).changed


def test_arm_waits_until_the_gripper_reaches_its_target():
    sm = GripperStateMachine(CONFIG, OPEN)
    assert not sm.command(CLOSED, True, 0.0).changed
    decision = sm.command(CLOSED, True, 0.1)
    assert (
        decision.changed
        and decision.target_width_m == CONFIG.closed_width_m
        and sm.should_hold_arm()
    )
    width, now = CONFIG.open_width_m, 0.1
    while width > CONFIG.closed_width_m + CONFIG.settle_tolerance_m:
        assert sm.should_hold_arm()
        now += 0.02
        width -= 0.002  # 0.1 m/s
        sm.feedback(width, now)
    assert not sm.should_hold_arm() and sm.last_done_reason == DoneReason.REACHED
    assert sm.state == CLOSED


def test_commands_while_moving_are_ignored():
    sm = GripperStateMachine(GripperConfig(hysteresis_steps=1), OPEN)
    assert sm.command(CLOSED, True, 0.0).changed
    for i in range(5):
        decision = sm.command(OPEN, True, 0.05 * (i + 1))
        assert not decision.changed and not decision.counted
    assert sm.state == CLOSED and sm.should_hold_arm()


@settings(max_examples=100, deadline=None)
@given(object_width=st.floats(0.01, 0.06), period=st.floats(0.005, 0.05))
def test_stall_on_an_object_ends_the_wait_but_not_before_min_motion(object_width, period):
    sm = GripperStateMachine(GripperConfig(hysteresis_steps=1), OPEN)
    sm.command(CLOSED, True, 0.0)
    now, width = 0.0, CONFIG.open_width_m
    while sm.should_hold_arm():
        now += period
        width = max(object_width, width - 0.1 * period)  # closes at 0.1 m/s, stops on the object
        sm.feedback(width, now)
        assert now < CONFIG.timeout_s
    assert sm.last_done_reason == DoneReason.STALLED
    assert now >= CONFIG.min_motion_s and now >= CONFIG.stall_window_s


def test_a_gripper_that_starts_late_is_not_mistaken_for_a_stall():
    config = GripperConfig(hysteresis_steps=1, stall_window_s=0.1, min_motion_s=0.4)
    sm = GripperStateMachine(config, OPEN)
    sm.command(CLOSED, True, 0.0)
    now = 0.0
    while now < 0.35:  # command latency: the fingers have not moved yet
        now += 0.02
        sm.feedback(config.open_width_m, now)
        assert sm.should_hold_arm(), f"released at {now:.2f} s before the gripper moved"
    width = config.open_width_m
    while sm.should_hold_arm():
        now += 0.02
        width = max(0.0, width - 0.002)
        sm.feedback(width, now)
    assert sm.last_done_reason == DoneReason.REACHED


def test_timeout_releases_the_arm_when_the_gripper_never_settles():
    config = GripperConfig(hysteresis_steps=1, timeout_s=1.0)
    sm = GripperStateMachine(config, OPEN)
    sm.command(CLOSED, True, 0.0)
    now = 0.0
    while sm.should_hold_arm():
        now += 0.02
        sm.feedback(0.03 + 0.005 * ((-1) ** int(now * 50)), now)  # jitters, never settles or stalls
        assert now <= config.timeout_s + 0.021
    assert sm.last_done_reason == DoneReason.TIMEOUT and now >= config.timeout_s


def test_no_feedback_at_all_times_out():
    sm = GripperStateMachine(GripperConfig(hysteresis_steps=1, timeout_s=0.5), OPEN)
    sm.command(CLOSED, True, 0.0)
    sm.feedback(float("nan"), 0.3)
    assert sm.should_hold_arm()
    sm.feedback(float("nan"), 0.6)
    assert not sm.should_hold_arm() and sm.last_done_reason == DoneReason.TIMEOUT


def test_state_from_width():
    sm = GripperStateMachine(CONFIG)
    assert sm.state_from_width(0.06) == OPEN and sm.state_from_width(0.01) == CLOSED


@pytest.mark.parametrize(
    ("kwargs", "field_name"),
    [
        ({"hysteresis_steps": 0}, "hysteresis_steps"),
        ({"hysteresis_steps": True}, "hysteresis_steps"),
        ({"open_width_m": 0.0}, "open_width_m"),
        ({"closed_width_m": -0.01}, "closed_width_m"),
        ({"timeout_s": 0.0}, "timeout_s"),
    ],
)
def test_config_rejects_bad_values_naming_the_field(kwargs, field_name):
    with pytest.raises(ValueError, match=field_name):
        GripperConfig(**kwargs)
