"""The policy node's step loop (pure Python: no rclpy, no DDS).

The loop runs against a real input gate, episode tracker and hold policy, a scripted decoder
and :class:`~test.polling.ManualClock` clocks: a slow decode is a step of the clock.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from heisd_ros.nodes.decode_worker import WorkerError
from heisd_ros.nodes.policy_episode import EpisodeTracker
from heisd_ros.nodes.policy_inputs import InputGate, RobotInput
from heisd_ros.nodes.policy_staleness import TOO_SLOW_MIN_STEPS, HoldPolicy
from heisd_ros.nodes.policy_step_loop import StepLoop
from test.polling import ManualClock, wait_until

IMG = np.zeros((16, 16, 3), np.uint8)
ACTION = np.array([0.01, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0])


class Decoder:
    """A decoder that takes ``decode_s`` of the clocks per step, or raises ``error``."""

    def __init__(self, clocks, decode_s: float = 0.05) -> None:
        self.clocks, self.decode_s = clocks, decode_s
        self.observations, self.episodes, self.error = [], [], None
        self.begin_error = None

    def submit(self, observation) -> None:
        self.observations.append(observation)

    def result(self):
        for clock in self.clocks:
            clock.advance(self.decode_s)
        if self.error is not None:
            raise self.error
        return SimpleNamespace(action=ACTION)

    def begin_episode(self, task) -> None:
        if self.begin_error is not None:
            raise self.begin_error
        self.episodes.append(task)


class Latency:
    """Records what the loop reports, and the median decode time the hold policy asks for."""

    def __init__(self) -> None:
        self.calls = []
        self.decode_ms = []

    def step_started(self, stamp_s, now_s) -> None:
        self.calls.append(("step_started", stamp_s, now_s))

    def decoded(self, decode_ms, held_stale) -> None:
        self.decode_ms.append(decode_ms)
        self.calls.append(("decoded", round(decode_ms, 6), held_stale))

    def decode_p50_ms(self, min_steps: int = 1):
        return float(np.median(self.decode_ms)) if len(self.decode_ms) >= min_steps else None

    def published(self, stamp_s, now_s, decode_ms) -> None:
        self.calls.append(("published", stamp_s, round(now_s, 6), round(decode_ms, 6)))


class Rig:
    """A step loop wired to recording stand-ins of the node's side."""

    def __init__(self, instruction="pick it", decode_s=0.05, **settings) -> None:
        self.config = SimpleNamespace(**{"min_period_s": 0.0, "max_command_age_s": 0.4,
                                         "warn_throttle_s": 0.0, "input_timeout_s": 1.0,
                                         **settings})
        self.clock, self.perf = ManualClock(100.0), ManualClock(5.0)
        self.events, self.warnings = [], []
        self.gate = InputGate()
        self.episodes = EpisodeTracker(instruction, "t0", jump_m=0.1)
        self.holds = HoldPolicy(self.config, self.clock, self.warnings.append)
        self.latency = Latency()
        self.decoder = Decoder([self.clock, self.perf], decode_s)
        self.failed = threading.Event()
        self.owner_drops_lost_worker = False
        self.loop = StepLoop(self.config, self.gate, self.episodes, self.holds, self.latency,
                             clock=self.clock, publish=self.publish,
                             take_robot_state=lambda: self.events.append("robot state"),
                             worker_lost=self.worker_lost,
                             episode_started=lambda why: self.events.append(("episode", why)),
                             failed=self.failed.set, perf_counter=self.perf)
        self.loop.decoder = self.decoder

    def worker_lost(self, exc):
        self.events.append(("lost", str(exc)))
        if self.owner_drops_lost_worker:  # what the node does
            self.loop.decoder = None

    def publish(self, step, step_index, snap):
        self.events.append(("command", step_index, snap.stamp_s))
        return lambda: self.events.append(("viz", step_index))

    def frames(self, age_s=0.0, joints=0.1):
        """New frames from both cameras and a robot state, ``age_s`` old."""
        stamp = self.clock() - age_s
        self.gate.add_robot(RobotInput(stamp, np.full(6, joints), 0.07,
                                       np.array([0.3, 0.0, 0.3]), np.zeros(3)))
        self.gate.add_frame("third_person", stamp, IMG)
        self.gate.add_frame("wrist", stamp, IMG)
        return stamp

    def commands(self):
        return [e for e in self.events if e[0] == "command"]


def test_good_input_sends_one_command_then_its_viz_and_the_episode_moves_on():
    rig = Rig()
    stamp = rig.frames()
    rig.loop.run_steps()
    assert rig.events == ["robot state", ("command", 0, stamp), "robot state", ("viz", 0)]
    observation = rig.decoder.observations[0]
    assert observation.instruction == "pick it" and observation.stamp_s == stamp
    assert observation.episode.step_index == 0 and observation.episode.task == "t0"
    assert rig.episodes.state.step_index == 1 and rig.loop.commands_sent == 1
    assert rig.latency.calls == [("step_started", stamp, 100.0), ("decoded", 50.0, False),
                                 ("published", stamp, 100.05, 50.0)]
    assert rig.holds.refusals == {} and rig.holds.last_problem == ""
    assert rig.loop.run_steps() is None and len(rig.commands()) == 1  # nothing new: no step


def test_frames_too_old_when_the_action_is_ready_are_held_and_the_episode_stays():
    rig = Rig(decode_s=0.5)  # longer than max_command_age_s
    rig.holds.refuse("stale frames", "stale frames: earlier")
    rig.frames()
    rig.loop.run_steps()
    assert rig.commands() == [] and rig.holds.refusals["stale command"] == 1
    assert rig.holds.last_problem == ("stale command: its frames were 0.500 s old when the "
                                      "action was ready (max_command_age_s 0.4 s; decode took "
                                      "500 ms); not sent")
    assert rig.latency.calls[-1] == ("decoded", 500.0, True)
    assert rig.episodes.state.step_index == 0 and rig.loop.commands_sent == 0
    rig.decoder.decode_s = 0.05
    rig.frames()
    rig.loop.run_steps()
    assert rig.commands() and rig.holds.last_problem == ""  # sent: nothing holds now


def test_a_machine_too_slow_for_the_limit_is_warned_about_once():
    rig = Rig(decode_s=0.5)
    for _ in range(TOO_SLOW_MIN_STEPS + 2):
        rig.frames()
        rig.loop.run_steps()
    slow = [w for w in rig.warnings if w.startswith("this machine decodes too slowly")]
    assert len(slow) == 1 and rig.holds.too_slow_warning == slow[0]
    assert rig.holds.refusals["stale command"] == TOO_SLOW_MIN_STEPS + 2


@pytest.mark.parametrize("case,kind", [
    (dict(joints=float("nan")), "NaN in the robot state"),
    (dict(age_s=3.0), "stale frames"),
    (dict(age_s=-1.0), "frame from the future"),
])
def test_input_the_gate_refuses_is_a_hold_named_by_its_rule(case, kind):
    rig = Rig()
    rig.frames(**case)
    rig.loop.run_steps()
    assert rig.commands() == [] and rig.decoder.observations == []
    assert kind in rig.holds.refusals and rig.holds.last_problem.startswith(kind)


def test_without_an_instruction_nothing_is_decoded():
    rig = Rig(instruction=" ")
    rig.frames()
    rig.loop.run_steps()
    assert rig.decoder.observations == [] and rig.holds.refusals == {"no instruction": 1}
    assert rig.holds.last_problem == ("no instruction: set the `instruction` parameter or call "
                                      "~/set_instruction")


def test_a_failed_decode_is_a_hold_and_a_lost_worker_goes_to_the_owner():
    rig = Rig()
    rig.decoder.error = ValueError("bad bins")
    rig.frames()
    rig.loop.run_steps()
    assert rig.holds.last_problem == "decode failed: bad bins" and rig.commands() == []
    rig.decoder.error = WorkerError("decode worker (pid 7) exited with code -9")
    rig.frames()
    rig.loop.run_steps()
    assert rig.events[-1] == ("lost", "decode worker (pid 7) exited with code -9")
    rig.loop.decoder = None  # what the owner does
    submitted = len(rig.decoder.observations)
    rig.frames()
    rig.loop.run_steps()
    assert len(rig.decoder.observations) == submitted  # no more steps


def test_a_worker_lost_as_an_episode_begins_ends_the_step_without_a_decode():
    rig = Rig()
    rig.owner_drops_lost_worker = True
    lost = WorkerError("decode worker (pid 7) exited with code -9")
    rig.decoder.begin_error = lost
    rig.episodes.request("new instruction", "t1", since_s=rig.clock() - 1.0)
    rig.frames()
    rig.loop.run_steps()  # raised AttributeError on None before
    assert ("lost", str(lost)) in rig.events
    assert rig.decoder.observations == [] and rig.commands() == []


def test_a_requested_episode_starts_before_the_next_step():
    rig = Rig()
    rig.frames()
    rig.loop.run_steps()
    rig.episodes.request("new instruction", "t1", since_s=rig.clock() + 0.01)
    rig.clock.advance(0.02)
    stamp = rig.frames()
    rig.loop.run_steps()
    assert ("episode", "new instruction") in rig.events and rig.decoder.episodes == ["t1"]
    assert rig.episodes.pending is None and rig.episodes.started == 1
    observation = rig.decoder.observations[-1]
    assert (observation.stamp_s, observation.episode.task) == (stamp, "t1")
    assert observation.episode.step_index == 0 and rig.episodes.state.step_index == 1


def test_a_new_episode_drops_the_frames_from_before_its_start():
    rig = Rig()
    rig.frames()
    rig.episodes.request("the EE jumped", since_s=rig.clock() + 0.01)
    rig.loop.run_steps()
    assert rig.commands() == [] and rig.decoder.observations == []


def test_min_period_spaces_the_steps():
    rig = Rig(min_period_s=1.0)
    rig.frames()
    rig.loop.run_steps()
    rig.clock.advance(0.1)
    rig.frames()
    rig.loop.run_steps()
    assert len(rig.commands()) == 1
    rig.clock.advance(1.0)
    rig.frames()
    rig.loop.run_steps()
    assert len(rig.commands()) == 2


def test_the_thread_steps_when_woken_and_hands_an_error_to_its_owner():
    rig = Rig()
    rig.loop.start()
    try:
        rig.frames()
        rig.loop.wake()
        assert wait_until(lambda: len(rig.commands()) == 1 and ("viz", 0) in rig.events)
        rig.decoder.error = TypeError("a bug")
        rig.frames()
        rig.loop.wake()
        assert wait_until(rig.failed.is_set), "the failure never reached the owner"
        assert isinstance(rig.loop.failure, TypeError)
        with pytest.raises(TypeError, match="a bug"):
            rig.loop.raise_failure()  # what the owner does where it stops the process
    finally:
        rig.loop.stop(timeout_s=5.0)
    assert not rig.loop._thread.is_alive()


def test_stop_ends_an_idle_thread():
    rig = Rig()
    rig.loop.start()
    rig.loop.stop(timeout_s=5.0)
    assert not rig.loop._thread.is_alive() and rig.loop.failure is None
    rig.loop.raise_failure()  # nothing failed: nothing to raise


def test_the_policy_modules_import_no_ros():
    code = ("import sys; import heisd_ros.nodes.policy_step_loop, heisd_ros.nodes.policy_episode, "
            "heisd_ros.nodes.policy_staleness; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('rclpy', 'heisd_ros') "
            "and (m.startswith('rclpy') or m.startswith('heisd_ros.msg') "
            "or m.startswith('heisd_ros.srv'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
