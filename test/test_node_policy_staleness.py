"""When the policy node holds and how it says why (pure Python: no rclpy, no DDS)."""

from __future__ import annotations

import math
from types import SimpleNamespace

from heisd_ros.nodes.policy_staleness import (
    TOO_SLOW_MIN_STEPS,
    HoldPolicy,
    stale_command,
)
from test.polling import ManualClock

TOPICS = {"third_person": "/cam/third", "wrist": "/cam/wrist", "joint_states": "/joint_states"}


def holds_with(**settings) -> tuple[HoldPolicy, ManualClock, ManualClock, list[str]]:
    """(policy, node clock, monotonic clock, warnings)."""
    config = SimpleNamespace(**{"warn_throttle_s": 2.0, "input_timeout_s": 1.0,
                                "max_command_age_s": 0.4, **settings})
    clock, monotonic, warnings = ManualClock(), ManualClock(50.0), []
    return HoldPolicy(config, clock, warnings.append, monotonic=monotonic), clock, monotonic, \
        warnings


class Latency:
    """A step-latency stand-in: the median decode time once ``steps`` reach the minimum."""

    def __init__(self, decode_ms: float, steps: int) -> None:
        self.decode_ms, self.steps = decode_ms, steps

    def decode_p50_ms(self, min_steps: int = 1) -> float | None:
        return self.decode_ms if self.steps >= min_steps else None


def test_a_command_is_stale_past_the_age_limit_and_when_its_age_is_unknown():
    assert stale_command(0.4, 0.4, 120.0) == ""
    problem = stale_command(0.5, 0.4, 120.4)
    assert problem == ("stale command: its frames were 0.500 s old when the action was ready "
                       "(max_command_age_s 0.4 s; decode took 120 ms); not sent")
    assert stale_command(math.nan, 0.4, 1.0).startswith("stale command: its frames were nan")


def test_a_refusal_is_counted_and_kept_and_its_warning_throttled_per_kind():
    holds, _clock, monotonic, warnings = holds_with(warn_throttle_s=2.0)
    holds.refuse("stale frames", "stale frames: 3.000 s old")
    holds.refuse("stale frames", "stale frames: 3.100 s old")
    holds.refuse("unpaired frames", "unpaired frames: no wrist frame")
    assert holds.refusals == {"stale frames": 2, "unpaired frames": 1}
    assert warnings == ["holding, no command: stale frames: 3.000 s old",
                        "holding, no command: unpaired frames: no wrist frame"]
    assert holds.last_problem == holds.last_refusal == "unpaired frames: no wrist frame"
    monotonic.advance(2.0)
    holds.refuse("stale frames", "stale frames: 5.000 s old")
    assert warnings[-1] == "holding, no command: stale frames: 5.000 s old"


def test_without_a_throttle_every_refusal_warns():
    holds, _clock, _monotonic, warnings = holds_with(warn_throttle_s=0.0)
    for _ in range(3):
        holds.refuse("stale command", "stale command: late")
    assert len(warnings) == 3


def test_a_sent_command_clears_the_live_problem_but_not_the_last_refusal():
    holds, _clock, _monotonic, _warnings = holds_with()
    holds.refuse("no instruction", "no instruction: set it")
    holds.sent()
    assert holds.last_problem == "" and holds.last_refusal == "no instruction: set it"


def test_a_machine_too_slow_for_the_age_limit_is_named_once_after_enough_steps():
    holds, _clock, _monotonic, warnings = holds_with(max_command_age_s=0.4)
    holds.check_speed(Latency(900.0, TOO_SLOW_MIN_STEPS - 1))
    holds.check_speed(Latency(400.0, TOO_SLOW_MIN_STEPS))   # at the limit: fine
    assert holds.too_slow_warning == "" and warnings == []
    holds.check_speed(Latency(900.0, TOO_SLOW_MIN_STEPS))
    assert holds.too_slow_warning.startswith("this machine decodes too slowly for the "
                                             "command-age limit: a step takes 900 ms")
    assert "more than max_command_age_s = 0.4 s" in holds.too_slow_warning
    assert "GPU" in holds.too_slow_warning and "raise max_command_age_s" in holds.too_slow_warning
    holds.check_speed(Latency(2000.0, 50))
    assert warnings == [holds.too_slow_warning]  # said once, then kept


def test_inputs_never_heard_or_silent_are_named_once_nothing_happened_for_the_timeout():
    holds, clock, _monotonic, _warnings = holds_with(input_timeout_s=1.0)
    holds.heard("third_person", clock())
    clock.advance(0.9)
    holds.heard("wrist", clock())
    assert holds.waiting_for(clock(), TOPICS) == ""  # not idle for the timeout yet
    clock.advance(0.6)
    assert holds.waiting_for(clock(), TOPICS, "an instruction (parameter)") == (
        "waiting for input: /cam/third (silent for 1.5 s); /joint_states (nothing received "
        "yet); an instruction (parameter)")


def test_a_refusal_or_a_command_is_activity_and_a_heard_input_is_not_named():
    holds, clock, _monotonic, _warnings = holds_with(input_timeout_s=1.0)
    clock.advance(2.0)
    holds.refuse("stale frames", "stale frames: old")
    assert holds.waiting_for(clock(), TOPICS) == ""
    clock.advance(2.0)
    holds.sent()
    clock.advance(0.5)
    assert holds.waiting_for(clock(), TOPICS) == ""
    clock.advance(0.6)
    for name in TOPICS:
        holds.heard(name, clock())
    assert holds.waiting_for(clock(), TOPICS) == ""  # everything is heard: nothing to name


def test_settings_are_read_at_each_use():
    holds, clock, _monotonic, _warnings = holds_with(input_timeout_s=30.0)
    clock.advance(1.0)
    assert holds.waiting_for(clock(), TOPICS) == ""
    holds.config.input_timeout_s = 0.5
    assert holds.waiting_for(clock(), TOPICS).startswith("waiting for input: /cam/third")
