"""Real-time closed loop: the world moves while the policy decides, so latency costs time.

Latencies are made exact with a fake wall clock that the test policies advance.
"""

from __future__ import annotations

import gzip
import json
import math
from fractions import Fraction

import numpy as np
import pytest

from heisd_ros.sim.config import SimConfig
from heisd_ros.sim.env import PiperSimEnv
from heisd_ros.sim.expert import ScriptedExpert
from heisd_ros.sim.runner import RealTime, run_episodes
from heisd_ros.sim.suites import get_task
from heisd_ros.tools import eval as eval_tool

FAST = SimConfig(render=False)
SUITE, TASK = "piper_goal", "red_block_on_plate"
PERIOD_S = 1.0 / FAST.control_rate_hz


class FakeClock:
    """A wall clock that only moves when a test policy says so."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


class ConstantPolicy:
    """The same delta every step, taking ``latency_s`` of (fake) wall time per decision."""

    def __init__(self, clock: FakeClock, latency_s: float, action, stats: bool = False):
        self.clock, self.latency_s = clock, latency_s
        self.action = np.asarray(action, dtype=np.float64)
        self.stats = stats
        self.observations = []

    def act(self, observation):
        self.observations.append(observation)
        self.clock.now_s += self.latency_s
        if self.stats:
            return self.action.copy(), {"target_forwards": 7}
        return self.action.copy()


MOVE = [0.02, 0.01, -0.01, 0.0, 0.0, 0.05, 0.0]


def _run(env, policy, steps, realtime=None, observer=None):
    return run_episodes(policy, SUITE, TASK, 1, 3, steps, env=env, realtime=realtime,
                        observer=observer).episodes[0]


def test_zero_latency_on_frames_at_the_control_rate_is_lockstep():
    """Latency 0: a decision on every control period, and the same physics bit for bit."""
    with PiperSimEnv(get_task(SUITE, TASK), FAST) as env:
        lockstep = _run(env, ConstantPolicy(FakeClock(), 0.0, MOVE), 8)
        q_lockstep = env.data.qpos.copy()
        assert lockstep.world_time_s is None and lockstep.commands is None
        for camera_hz in (10.0, 30.0):   # 30 Hz: every third frame is on a control period
            clock = FakeClock()
            real = _run(env, ConstantPolicy(clock, 0.0, MOVE, stats=True), 8,
                        RealTime(camera_rate_hz=camera_hz, clock=clock))
            assert real.commands == real.steps == lockstep.steps == 8
            assert real.world_time_s == pytest.approx(8 * PERIOD_S)
            assert np.array_equal(env.data.qpos, q_lockstep), camera_hz
            periods = [s["rt_period_ms"] for s in real.stats]
            assert periods[:-1] == pytest.approx([100.0] * 7) and periods[-1] is None
            first = real.stats[0]
            assert first["target_forwards"] == 7   # the policy's own stats keep their keys
            assert first["rt_latency_ms"] == first["rt_world_latency_ms"] == 0.0
            assert not any(s["rt_late"] for s in real.stats)


def _expected_commands(latency_s: Fraction, camera_hz: int, limit: int) -> int:
    """The rules, in exact arithmetic: frame-aligned starts, a period apart at least."""
    period, budget = Fraction(1, 10), limit * Fraction(1, 10)
    count, now, previous = 0, Fraction(0), None
    while True:
        earliest = now if previous is None else max(now, previous + period)
        start = Fraction(math.ceil(earliest * camera_hz), camera_hz)
        if start >= budget or start + latency_s >= budget:
            return count
        count, now, previous = count + 1, start + latency_s, start


@pytest.mark.parametrize(("latency_s", "time_scale"), [(0.15, 1.0), (0.075, 2.0)])
def test_a_policy_slower_than_the_control_period_issues_fewer_commands(latency_s, time_scale):
    # 0.15 s of world time per decision: starts on frames 0, 5, 10, ... (every 1/6 s at 30 Hz),
    # the sixth command lands at 0.983 s, the seventh decision would start at 1.0 s
    expected = _expected_commands(Fraction(3, 20), 30, 10)
    assert expected == 6
    clock = FakeClock()
    with PiperSimEnv(get_task(SUITE, TASK), FAST) as env:
        real = _run(env, ConstantPolicy(clock, latency_s, MOVE), 10,
                    RealTime(time_scale=time_scale, camera_rate_hz=30.0, clock=clock))
    assert real.commands == expected and not real.success
    assert real.world_time_s == pytest.approx(1.0)   # the whole budget of 10 periods
    assert all(s["rt_late"] for s in real.stats)
    assert [s["rt_world_latency_ms"] for s in real.stats] == pytest.approx([150.0] * 6)
    assert [s["rt_latency_ms"] for s in real.stats] == pytest.approx([latency_s * 1e3] * 6)
    assert [s["rt_period_ms"] for s in real.stats[:-1]] == pytest.approx([1e3 / 6] * 5)


def test_a_command_landing_after_the_budget_is_not_counted():
    # 0.25 s per decision, 3 periods: the first lands at 0.25 s, the second would at 0.5 s
    clock = FakeClock()
    with PiperSimEnv(get_task(SUITE, TASK), FAST) as env:
        real = _run(env, ConstantPolicy(clock, 0.25, MOVE), 3, RealTime(clock=clock))
        assert real.commands == 1 and real.world_time_s == pytest.approx(0.3)
    assert _expected_commands(Fraction(1, 4), 30, 3) == 1


def test_the_world_moves_while_the_policy_decides():
    delta_m = 0.03
    push = [delta_m, 0, 0, 0, 0, 0, 0]
    seen = []

    def observer(episode, step, observation, action, outcome):
        seen.append((observation.proprio[0], outcome.state.ee_position_m[0],
                     outcome.observation is observation, outcome.success))

    with PiperSimEnv(get_task(SUITE, TASK), FAST) as env:
        lockstep = ConstantPolicy(FakeClock(), 0.0, push)
        _run(env, lockstep, 3)
        clock = FakeClock()
        slow = ConstantPolicy(clock, 0.05, push)
        real = _run(env, slow, 3, RealTime(clock=clock), observer)
    assert real.commands == 3
    # Lockstep: the next observation shows the whole step.
    x = [o.proprio[0] for o in lockstep.observations]
    assert x[1] - x[0] == pytest.approx(delta_m, abs=0.002)
    # Real time: the command landed 50 ms into the period, so the next frame (at 100 ms) was
    # taken while the arm was still on its way ...
    x = [o.proprio[0] for o in slow.observations]
    assert 0.3 * delta_m < x[1] - x[0] < 0.85 * delta_m, x
    # ... and it kept moving while the policy decided on that frame.
    obs_x, at_command_x, same_observation, success = seen[1]
    assert obs_x == x[1] and same_observation and not success
    assert at_command_x - obs_x > 0.2 * delta_m
    assert at_command_x - x[0] == pytest.approx(delta_m, abs=0.003)


def test_success_ends_the_episode_between_commands():
    spec = get_task(SUITE, TASK)
    with PiperSimEnv(spec, FAST) as env:
        expert = ScriptedExpert(env)
        lockstep = _run(env, expert, None)
        clock = FakeClock()
        real = _run(env, expert, None, RealTime(camera_rate_hz=10.0, clock=clock))
        assert env.success()
    assert lockstep.success and lockstep.steps < spec.max_steps
    assert real.success and real.commands == lockstep.steps
    # it succeeded within the last command's period, not at its end
    assert real.world_time_s < real.commands * PERIOD_S - 1e-9
    assert real.world_time_s > (real.commands - 1) * PERIOD_S
    # checked every 20 ms of world time
    assert round(real.world_time_s / 0.02, 6) == round(real.world_time_s / 0.02)


@pytest.mark.parametrize("value", [0, -1.0, math.nan, math.inf, "2", True])
def test_real_time_settings_are_checked(value):
    with pytest.raises(ValueError, match="time_scale: expected a finite number > 0"):
        RealTime(time_scale=value)
    with pytest.raises(ValueError, match="camera_rate_hz: expected a finite number > 0"):
        RealTime(camera_rate_hz=value)


def test_run_episodes_refuses_a_realtime_that_is_not_one():
    with pytest.raises(ValueError, match="realtime: expected a RealTime"):
        run_episodes(lambda o: np.zeros(7), SUITE, TASK, 1, 0, 2, config=FAST, realtime=2.0)


def test_eval_refuses_real_time_options_without_real_time(capsys):
    common = ["--suites", SUITE, "--tasks", TASK, "--episodes", "1", "--max-steps", "2"]
    assert eval_tool.main([*common, "--time-scale", "2"]) == 2
    assert "--time-scale: only with --real-time" in capsys.readouterr().err
    assert eval_tool.main([*common, "--camera-rate-hz", "15"]) == 2
    assert "--camera-rate-hz: only with --real-time" in capsys.readouterr().err
    assert eval_tool.main([*common, "--no-pace"]) == 2
    assert "--no-pace: only with --real-time" in capsys.readouterr().err
    assert eval_tool.main([*common, "--real-time", "--time-scale", "0"]) == 2
    assert "--time-scale: time_scale: expected a finite number > 0" in capsys.readouterr().err
    assert eval_tool.main([*common, "--real-time", "--camera-rate-hz", "nan"]) == 2
    assert "--camera-rate-hz: camera_rate_hz" in capsys.readouterr().err


def test_eval_refuses_to_resume_a_run_of_the_other_timing(tmp_path, capsys):
    from heisd_ros.eval.job_results import JobResults

    out = tmp_path / "e.json"
    JobResults(out, "an earlier run").save(TASK, [], {"timing": {"mode": "lockstep"}})
    code = eval_tool.main(["--suites", SUITE, "--tasks", TASK, "--episodes", "1",
                           "--max-steps", "2", "--real-time", "--json", str(out), "--resume"])
    assert code == 2
    err = capsys.readouterr().err
    assert "--resume: the tasks kept in" in err and "ran in lockstep" in err
    assert "this run is in real time (--time-scale 1.0, --camera-rate-hz 30.0)" in err


def test_eval_end_to_end_in_real_time(tiny_target_path, tmp_path, capsys):
    common = ["--suites", SUITE, "--tasks", TASK, "--episodes", "1", "--max-steps", "3",
              "--image-size", "32", "--methods", "ar", "--target", tiny_target_path,
              "--threads", "1"]
    real, lock = tmp_path / "real", tmp_path / "lock"
    assert eval_tool.main([*common, "--real-time", "--time-scale", "0.5", "--json",
                           str(real / "e.json"), "--report", str(real)]) == 0, \
        capsys.readouterr().err
    assert "cmd/s" in capsys.readouterr().out
    result = json.loads((real / "e.json").read_text())
    assert result["timing"] == {"mode": "real_time", "time_scale": 0.5, "camera_rate_hz": 30.0,
                                "pace": True}
    cfg = result["config"]
    assert cfg["real_time"] is True and cfg["time_scale"] == 0.5
    (episode,) = result["episodes"]
    assert 1 <= episode["commands"] == episode["steps"] <= 3
    assert episode["world_time_s"] == pytest.approx(0.3) or episode["success"]
    rt = result["suites"]["all"]["ar"]["real_time"]
    assert rt["command_rate_hz"] == pytest.approx(episode["commands"]
                                                  / episode["world_time_s"])
    assert 0 < rt["command_age_ms"]["p50"] <= rt["command_age_ms"]["p99"]
    assert 0.0 <= rt["late_share"] <= 1.0
    assert rt["world_time_s_mean"] == episode["world_time_s"]
    report = (real / "report.md").read_text()
    assert "cmd age p99 ms" in report and "real_time: True" in report
    assert "in real time at time scale 0.5" in report

    assert eval_tool.main([*common, "--json", str(lock / "e.json"), "--report",
                           str(lock)]) == 0
    assert "cmd/s" not in capsys.readouterr().out
    result = json.loads((lock / "e.json").read_text())
    assert result["timing"] == {"mode": "lockstep"} and "real_time" not in result["config"]
    assert "real_time" not in result["suites"]["all"]["ar"]
    assert "world_time_s" not in result["episodes"][0]
    report = (lock / "report.md").read_text()
    assert "cmd" not in report and "real time" not in report


def test_a_kept_part_records_its_timing(tiny_target_path, tmp_path, monkeypatch):
    """The parts --resume reads carry the timing they ran with."""
    from heisd_ros.eval import job_results

    out = tmp_path / "e.json"
    # keep the parts a finished run would delete
    monkeypatch.setattr(job_results.JobResults, "clear", lambda self: None)
    assert eval_tool.main(["--suites", SUITE, "--tasks", TASK, "--episodes", "1",
                           "--max-steps", "2", "--image-size", "32", "--methods", "ar",
                           "--target", tiny_target_path, "--threads", "1", "--real-time",
                           "--camera-rate-hz", "15", "--json", str(out)]) == 0
    with gzip.open(tmp_path / "e.json.parts" / f"{TASK}.json.gz", "rt") as f:
        kept = json.load(f)
    assert kept["desc"]["timing"] == {"mode": "real_time", "time_scale": 1.0,
                                      "camera_rate_hz": 15.0, "pace": True}
    # The whole budget of world time, whatever the load (a decision slower than the budget
    # applies no command, so the command count would depend on the machine).
    assert kept["runs"][0]["world_time_s"] == pytest.approx(0.2) or kept["runs"][0]["success"]


def test_paced_decisions_start_at_their_frames_time_on_the_wall_clock():
    """pace: the wall clock follows the world, so background work gets the time between."""
    waits = []
    clock = FakeClock()

    def sleep(seconds):
        waits.append(seconds)
        clock.now_s += seconds

    with PiperSimEnv(get_task(SUITE, TASK), FAST) as env:
        policy = ConstantPolicy(clock, 0.03, MOVE, stats=True)
        real = _run(env, policy, 5, RealTime(time_scale=2.0, camera_rate_hz=10.0, pace=True,
                                             clock=clock, sleep=sleep))
        # decisions at world 0, 0.1, ... 0.4 s = wall 0, 0.05, ... 0.2 s; each took 0.03 s
        assert real.commands == 5
        assert waits == pytest.approx([0.02] * 4)
        assert clock.now_s == pytest.approx(0.2 + 0.03)
        unpaced = FakeClock()
        _run(env, ConstantPolicy(unpaced, 0.03, MOVE), 5,
             RealTime(time_scale=2.0, camera_rate_hz=10.0, clock=unpaced, sleep=sleep))
        assert unpaced.now_s == pytest.approx(5 * 0.03) and len(waits) == 4
