"""Latency profiles: pricing from counters, the device timeline, profile files, priced real time.

Pure Python, except the runner tests, which use the real simulator without rendering.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from heisd_ros.latency import DecisionCounters, DeviceTimeline, LatencyProfile, price
from heisd_ros.latency.profile import load_profile, save_profile, shipped_profiles

PROFILE = LatencyProfile(name="hand", vision_ms=3.0, prefill_base_ms=10.0,
                         prefill_per_token_ms=0.5, forward_base_ms=4.0,
                         forward_per_token_ms=0.25, drafter_forward_ms=1.5, draft_call_ms=0.2,
                         retrieval_ms=2.0, overhead_ms=7.0)

AR = DecisionCounters(vision=1, forwards=((20, 0),) + ((1, 0),) * 6)
HYBRID = DecisionCounters(vision=1, forwards=((20, 12), (1, 5), (1, 0)), drafter_forwards=3,
                          draft_calls=2, retrievals=1)
UNVERIFIED = DecisionCounters(vision=1, retrievals=1, unverified=True, check=(20, 7))


def test_latency_from_counters_is_exactly_the_profiles_sum():
    # AR: vision 3 + prefill 10 + 0.5 * 20 + 6 decode forwards of 4 + overhead 7.
    ar = price(AR, PROFILE)
    assert ar.parts == {"vision": 3.0, "prefill": 20.0, "forwards": 24.0, "drafter": 0.0,
                        "retrieval": 0.0, "overhead": 7.0}
    assert ar.total_ms == 54.0 and ar.device_ms == 47.0 and ar.host_ms == 7.0
    assert ar.check_ms == 0.0
    # Prefill carries a 12-token tree: 10 + 0.5 * 32; verify with a 5-node tree: 4 + 0.25 * 5.
    hybrid = price(HYBRID, PROFILE)
    assert hybrid.parts["prefill"] == 26.0
    assert hybrid.parts["forwards"] == (4.0 + 0.25 * 5) + 4.0
    assert hybrid.parts["drafter"] == 3 * 1.5 + 2 * 0.2
    assert hybrid.parts["retrieval"] == 2.0
    assert hybrid.total_ms == pytest.approx(3 + 26 + 9.25 + 4.9 + 2 + 7)
    # Unverified: no forward; its check is one prefill of the prompt and 7 tokens.
    skipped = price(UNVERIFIED, PROFILE)
    assert skipped.total_ms == 3.0 + 2.0 + 7.0
    assert skipped.check_ms == 10.0 + 0.5 * 27
    # The dict form a step record carries prices the same.
    assert price(HYBRID.to_dict(), PROFILE) == hybrid
    assert DecisionCounters.from_dict(UNVERIFIED.to_dict()) == UNVERIFIED


def test_a_profiled_models_prompt_length_replaces_the_counted_one():
    other = LatencyProfile(**{**PROFILE.to_dict(), "name": "other", "prompt_tokens": 280})
    assert price(AR, other).parts["prefill"] == 10.0 + 0.5 * 280
    assert price(HYBRID, other).parts["prefill"] == 10.0 + 0.5 * (280 + 12)


def test_the_paper_profile_gives_the_papers_openvla_step():
    paper = load_profile("openvla-7b-paper")
    assert "openvla-7b-paper" in shipped_profiles()
    ar = price(DecisionCounters(vision=1, forwards=((30, 0),) + ((1, 0),) * 6), paper)
    # 174 ms = vision 8 + LLM 113 (1 prefill of 280 tokens + 6 forwards of 13.93) + other 53.
    assert ar.total_ms == pytest.approx(174.0, abs=0.01)
    assert ar.parts["prefill"] + ar.parts["forwards"] == pytest.approx(113.0, abs=0.01)
    # The fixed 53 ms caps any decoder's end-to-end speed-up at 174 / (8 + 53) = 2.85x.
    floor = price(DecisionCounters(vision=1), paper).total_ms
    assert ar.total_ms / floor == pytest.approx(2.85, abs=0.01)
    for name in ("vision_ms", "forward_base_ms", "prefill_per_token_ms", "drafter_forward_ms",
                 "overhead_ms", "retrieval_ms"):
        assert paper.sources[name], name
    assert any("overhead" in a for a in paper.assumptions)


def test_a_check_holding_the_device_delays_the_next_decision_by_exactly_its_rest():
    timeline = DeviceTimeline(PROFILE)
    first = timeline.decide(0.0, UNVERIFIED)        # command at 12 ms, check until 35.5 ms
    assert first.latency_ms == 12.0 and first.wait_ms == 0.0
    check_end_ms = 12.0 + 23.5
    start_ms = 20.0
    second = timeline.decide(start_ms / 1e3, AR)
    assert second.wait_ms == pytest.approx(check_end_ms - start_ms)
    assert second.latency_ms == pytest.approx(check_end_ms - start_ms + 54.0)
    # Once the check is over nothing waits.
    third = timeline.decide(1.0, AR)
    assert third.wait_ms == 0.0 and third.latency_ms == 54.0
    # A new episode starts with a free device.
    timeline.decide(2.0, UNVERIFIED)
    timeline.reset()
    assert timeline.decide(2.013, AR).wait_ms == 0.0


def test_a_check_on_a_spare_core_delays_only_a_decision_that_needs_its_verdict():
    core = LatencyProfile(**{**PROFILE.to_dict(), "name": "cpu", "check_occupies": "core"})
    timeline = DeviceTimeline(core)
    timeline.decide(0.0, UNVERIFIED)
    assert timeline.decide(0.02, AR).wait_ms == 0.0
    wants = DecisionCounters(vision=1, retrievals=1, unverified=True, collects_verdict=True)
    assert timeline.decide(0.03, wants).wait_ms == pytest.approx(35.5 - 30.0)


def test_the_time_scale_multiplies_every_duration():
    timeline = DeviceTimeline(PROFILE, scale=2.0)
    assert timeline.decide(0.0, UNVERIFIED).latency_ms == 24.0
    assert timeline.decide(0.0, AR).wait_ms == pytest.approx(24.0 + 47.0)


def test_fixed_profiles_and_files(tmp_path):
    fixed = load_profile("fixed:150")
    for counters in (AR, HYBRID, UNVERIFIED):
        assert price(counters, fixed).total_ms == 150.0
        assert price(counters, fixed).check_ms == 0.0
    assert load_profile("fixed:0").overhead_ms == 0.0
    path = save_profile(PROFILE, tmp_path / "p.yaml", header="fitted here")
    assert path.read_text().startswith("# fitted here\n")
    assert load_profile(str(path)) == PROFILE


@pytest.mark.parametrize("spec, message", [
    ("no-such-profile", "neither a shipped profile"), ("fixed:abc", "fixed:<ms>"),
    ("fixed:-1", "latency >= 0")])
def test_bad_profile_names_are_clear_errors(spec, message):
    with pytest.raises(ValueError, match=message):
        load_profile(spec)


def test_bad_profile_files_are_clear_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nvision_ms: -1\n")
    with pytest.raises(ValueError, match="vision_ms: expected a finite cost"):
        load_profile(str(bad))
    bad.write_text("name: x\nvison_ms: 1\n")
    with pytest.raises(ValueError, match="unknown fields \\['vison_ms'\\]"):
        load_profile(str(bad))
    bad.write_text("name: x\ncheck_occupies: gpu\n")
    with pytest.raises(ValueError, match="check_occupies"):
        load_profile(str(bad))


# ---------------------------------------------------------------- the runner at a profile
def _runner_setup():
    from heisd_ros.sim.config import SimConfig
    from heisd_ros.sim.env import PiperSimEnv
    from heisd_ros.sim.suites import get_task

    return PiperSimEnv(get_task("piper_goal", "red_block_on_plate"), SimConfig(render=False))


class CountedPolicy:
    """Always the same delta and counters; its wall time differs from call to call."""

    def __init__(self, counters: DecisionCounters, action=(0.01, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)):
        self.counters, self.action = counters, np.asarray(action, dtype=np.float64)
        self.calls = 0

    def act(self, observation):
        self.calls += 1
        sum(range(1000 * (self.calls % 7)))   # wall time that must not matter
        return self.action.copy(), {"counters": self.counters.to_dict()}


def test_priced_real_time_ignores_the_wall_clock_and_charges_the_profile():
    from heisd_ros.sim.runner import RealTime, run_episodes

    profile = LatencyProfile.fixed(150.0)

    def clock():   # a wall clock that races: 1 s per reading
        clock.now += 1.0
        return clock.now
    clock.now = 0.0

    with _runner_setup() as env:
        period_s = 1.0 / env.config.control_rate_hz
        result = run_episodes(CountedPolicy(AR), "piper_goal", "red_block_on_plate", 1, 0, 10,
                              env=env, realtime=RealTime(profile=profile, clock=clock)
                              ).episodes[0]
    ages = [s["rt_world_latency_ms"] for s in result.stats]
    assert ages and all(a == pytest.approx(150.0) for a in ages)
    assert all(s["rt_late"] for s in result.stats) and period_s < 0.15
    # 1 s of world time; a decision every 200 ms (150 ms, then the next 30 Hz frame).
    periods = [s["rt_period_ms"] for s in result.stats[:-1]]
    assert periods and all(p == pytest.approx(1000 / 30 * 5) for p in periods)
    assert all(s["rt_device_wait_ms"] == 0.0 for s in result.stats)


def test_priced_real_time_waits_for_a_check_behind_holding_the_device():
    from heisd_ros.sim.runner import RealTime, run_episodes

    heavy = LatencyProfile(name="heavy", overhead_ms=10.0, prefill_base_ms=250.0)
    with _runner_setup() as env:
        result = run_episodes(CountedPolicy(UNVERIFIED), "piper_goal", "red_block_on_plate", 1,
                              0, 10, env=env, realtime=RealTime(profile=heavy)).episodes[0]
    first, second = result.stats[:2]
    assert first["rt_device_wait_ms"] == 0.0 and first["rt_check_ms"] == 250.0
    # Check from 10 ms to 260 ms; the next decision starts on the frame at 100 ms.
    assert second["rt_device_wait_ms"] == pytest.approx(160.0)
    assert second["rt_world_latency_ms"] == pytest.approx(170.0)


def test_priced_real_time_needs_counters_and_no_pacing():
    from heisd_ros.sim.runner import RealTime, run_episodes

    with pytest.raises(ValueError, match="pace"):
        RealTime(profile=PROFILE, pace=True)
    with pytest.raises(ValueError, match="LatencyProfile"):
        RealTime(profile="openvla-7b-paper")
    with _runner_setup() as env, pytest.raises(ValueError, match="counters"):
        run_episodes(lambda obs: np.zeros(7), "piper_goal", "red_block_on_plate", 1, 0, 3,
                     env=env, realtime=RealTime(profile=PROFILE))
    assert math.isinf(DeviceTimeline(PROFILE).busy_until_s)


# ---------------------------------------------------------------- heisd-eval at profiles
def test_eval_at_fixed_latencies_and_the_sweep(tiny_target_path, tmp_path, capsys):
    """AR at 0 ms and 300 ms of fixed latency; the sweep reads both runs back."""
    import json

    from heisd_ros.tools import eval as eval_tool

    common = ["--suites", "piper_goal", "--tasks", "red_block_on_plate", "--episodes", "1",
              "--max-steps", "6", "--image-size", "32", "--methods", "ar", "--target",
              tiny_target_path, "--threads", "1", "--real-time"]
    paths = []
    for ms in (0, 300):
        path = tmp_path / f"fixed{ms}" / "e.json"
        fit = tmp_path / f"fit{ms}.yaml"
        assert eval_tool.main([*common, "--latency-profile", f"fixed:{ms}", "--json",
                               str(path), "--latency-profile-out", str(fit)]) == 0, \
            capsys.readouterr().err
        out = capsys.readouterr().out
        assert f"profile fixed:{ms}: predicted / measured mean ms per action here" in out
        result = json.loads(path.read_text())
        rt = result["suites"]["all"]["ar"]["real_time"]
        assert rt["command_age_ms"]["p50"] == rt["command_age_ms"]["p99"] == ms
        assert rt["late_share"] == (1.0 if ms else 0.0)
        assert result["profile_prediction"]["ar"]["predicted_ms"] == ms
        # The closed loop's own fit: AR's stages are its counters' prices, so it predicts them.
        fitted = load_profile(str(fit))
        assert fitted.name == f"fit{ms}" and fitted.vision_ms > 0 and fitted.forward_base_ms > 0
        own = result["latency_profile_fit"]["prediction"]["ar"]
        assert abs(own["error"]) < 0.5 and own["measured_ms"] > 0
        paths.append(str(path))
    # 0.6 s of world time: 6 commands at 0 ms; at 300 ms one lands at 0.3 s, the next decision
    # (frame at 0.3 s) would land at 0.6 s, when the time is up.
    runs = [json.loads(open(p).read())["episodes"][0] for p in paths]
    assert [r["commands"] for r in runs] == [6, 1] or runs[0]["success"]
    report = tmp_path / "sweep"
    assert eval_tool.main(["--sweep", *paths, "--report", str(report)]) == 0
    table = capsys.readouterr().out
    assert "fixed:0" in table and "fixed:300" in table and "world s to success" in table
    assert (report / "sweep.png").stat().st_size > 10_000
    assert "fixed:300" in (report / "sweep.md").read_text()
    # A lockstep run is refused, and so is --no-pace at a profile.
    lock = tmp_path / "lock.json"
    assert eval_tool.main([*common[:-1], "--json", str(lock)]) == 0
    capsys.readouterr()
    assert eval_tool.main(["--sweep", paths[0], str(lock)]) == 2
    assert "--real-time run" in capsys.readouterr().err
    assert eval_tool.main([*common, "--latency-profile", "fixed:0", "--no-pace"]) == 2
    assert "never paced" in capsys.readouterr().err


def test_the_sweep_plot_marks_other_methods_at_their_own_command_age(tmp_path):
    """AR's line over fixed latencies, and a HeiSD method of the profile run as a marker."""
    from matplotlib import image

    from heisd_ros.eval.sweep import plot_sweep, sweep_table

    def point(profile, method, age, wins):
        return {"profile": profile, "suite": "piper_dynamic", "method": method,
                "successes": wins, "episodes": 10, "success_rate": wins / 10,
                "sr_wilson95": [max(0.0, wins / 10 - 0.2), min(1.0, wins / 10 + 0.2)],
                "world_time_to_success_s": 12.0 if wins else None, "late_share": 0.5,
                "command_age_p50_ms": age}

    points = [point("fixed:0", "ar", 0.0, 8), point("fixed:200", "ar", 200.0, 2),
              point("openvla-7b-paper", "ar", 174.0, 1),
              point("openvla-7b-paper", "heisd_deadline", 99.0, 6)]
    only_ar = plot_sweep(tmp_path / "ar.png", points[:3])
    both = plot_sweep(tmp_path / "both.png", points)
    assert image.imread(both).shape == image.imread(only_ar).shape
    assert (image.imread(both) != image.imread(only_ar)).any()   # the marker and its legend
    _header, rows = sweep_table(points)
    assert [r[1] for r in rows].count("heisd_deadline") == 1
