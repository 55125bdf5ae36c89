"""heisd-bench sim-graph: per-episode windowing, the stall bound and the sim's log lines.

The pure figures (``heisd_ros.tools.graph.sim_report``, ``sg`` below) are checked on
synthetic timestamps; one short run starts the real graph.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import pytest

from heisd_ros.tools.bench import parse_args
from heisd_ros.tools.graph import sim_report as sg
from heisd_ros.tools.graph.listener import CAMERAS, Status, stamp_from_cdr
from heisd_ros.tools.graph.sim_cli import check_args

A = ("piper_goal", "red_block_on_plate", 0, 0)
B = ("piper_goal", "red_block_on_plate", 1, 1)
C = ("piper_goal", "red_block_on_plate", 2, 2)


def _statuses():
    """Episode A runs 10..20 s (time_limit), B 22..31 s (success), C from 33 s on."""
    return [Status(10.0, A, 0, False), Status(12.0, A, 5, False),
            Status(20.0, A, 100, True, False, "time_limit"),
            Status(22.0, B, 0, False), Status(25.0, B, 30, False),
            Status(31.0, B, 90, True, True, "success"), Status(33.0, C, 0, False)]


def test_running_intervals_exclude_the_reset_pauses():
    assert sg.running_intervals(_statuses(), 40.0) == [(10.0, 20.0), (22.0, 31.0), (33.0, 40.0)]
    # joined mid-episode (the latched status), and a late status after the done one
    late = [Status(14.0, A, 40, False), Status(20.0, A, 100, True, False, "fault"),
            Status(20.5, A, 100, False)]
    assert sg.running_intervals(late, 30.0) == [(14.0, 20.0)]
    # an episode that starts without the previous one's done status ends that one
    assert sg.running_intervals([Status(1.0, A, 0, False), Status(5.0, B, 0, False)],
                                9.0) == [(1.0, 5.0), (5.0, 9.0)]
    assert sg.running_intervals([], 9.0) == []
    assert sg.clip_intervals([(10.0, 20.0), (22.0, 31.0), (33.0, 40.0)], 15.0, 34.0) == [
        (15.0, 20.0), (22.0, 31.0), (33.0, 34.0)]


def test_rate_and_gaps_count_running_time_only():
    running = sg.clip_intervals(sg.running_intervals(_statuses(), 40.0), 15.0, 40.0)
    # 10 commands/s while episodes run, one 0.6 s hole inside B, stray ones in the pauses
    times = [15.0 + 0.1 * k for k in range(50)]  # 15.0 .. 19.9
    times += [22.0 + 0.1 * k for k in range(30)]  # 22.0 .. 24.9
    times += [25.5 + 0.1 * k for k in range(55)]  # 25.5 .. 30.9
    times += [33.0 + 0.1 * k for k in range(70)]  # 33.0 .. 39.9
    times += [20.5, 21.5, 32.0]  # in the pauses: the sim ignores them
    fig = sg.stream_figures(times, running)
    assert fig["running_s"] == pytest.approx(5.0 + 9.0 + 7.0)
    assert fig["count"] == 50 + 30 + 55 + 70
    assert fig["rate_hz"] == pytest.approx(205 / 21.0)
    # the hole in B, not the pauses between episodes (19.9 -> 22.0 -> ... -> 33.0)
    assert fig["max_gap_ms"] == pytest.approx(600.0)
    assert fig["max_gap_end_s"] == pytest.approx(25.5)
    assert sg.stream_figures([], running) == {"count": 0, "running_s": pytest.approx(21.0),
                                              "rate_hz": 0.0, "max_gap_ms": None,
                                              "max_gap_end_s": None}
    assert sg.stream_figures([1.0], [])["rate_hz"] is None


def test_stall_bound_and_verdict():
    bound = sg.stall_bound_ms(0.1, 1 / 30, 150.0)
    assert bound == pytest.approx(100.0 + 33.333 + 150.0, abs=1e-2)
    assert sg.stall_held(283.0, bound) is True
    assert sg.stall_held(284.0, bound) is False
    assert sg.stall_bound_ms(0.1, 1 / 30, None) is None
    assert sg.stall_held(500.0, None) is None and sg.stall_held(None, 100.0) is None


def test_episodes_ended_in_the_window():
    statuses = _statuses() + [Status(31.0, B, 90, True, True, "success")]  # repeated
    out = sg.episodes_ended(statuses, 15.0, 40.0)
    assert out == {"ended": 2, "successes": 1, "reasons": {"time_limit": 1, "success": 1},
                   "commands": [100, 90]}
    assert sg.episodes_ended(statuses, 21.0, 40.0)["ended"] == 1


SIM_LINE = ("[INFO] [{t}] [sim_node]: episode {n} over after 22.0 s (world) and {k} commands "
            "({r}/s): {how}; the next starts in 2 s; so far {ms} ms per frame rendered, "
            "{skipped} frames skipped, the world slowed {slowed} times")


def test_sim_log_figures():
    lines = [SIM_LINE.format(t="100.0", n=0, k=180, r="8.2", how="time_limit", ms="4.1",
                             skipped=3, slowed=0),
             "[WARN] [105.0] [sim_node]: the sim is 0.31 s of world time behind the clock "
             "(physics ...): the world slows down",
             SIM_LINE.format(t="110.0", n=1, k=120, r="9.0", how="fault (tracking error "
                             "0.12 m; arm held)", ms="5.5", skipped=10, slowed=2),
             SIM_LINE.format(t="130.0", n=2, k=60, r="9.1", how="success", ms="5.0",
                             skipped=12, slowed=2)]
    parsed = sg.parse_episode_lines(lines)
    assert [e["episode"] for e in parsed] == [0, 1, 2]
    assert parsed[1]["how"] == "fault (tracking error 0.12 m; arm held)"
    out = sg.sim_log_figures(lines, 101.0, 120.0)
    assert out["episode_lines_in_window"] == 1
    assert out["render_ms_per_frame"] == 5.5 and out["frames_skipped_so_far"] == 10
    assert out["frames_skipped_in_window"] == 7 and out["world_slowed_in_window"] == 2
    assert out["behind_warnings_in_window"] == 1
    none_before = sg.sim_log_figures(lines, 50.0, 101.0)
    assert none_before["frames_skipped_in_window"] is None
    assert none_before["frames_skipped_so_far"] == 3
    assert sg.sim_log_figures([], 0.0, 1.0)["render_ms_per_frame"] is None


def test_method_report_from_synthetic_arrivals():
    cmds = [(15.0 + 0.1 * k, 15.0 + 0.1 * k - 0.2) for k in range(50)]  # 200 ms old
    cmds += [(22.0 + 0.1 * k, 22.0 + 0.1 * k - 0.3) for k in range(90)]
    cmds[-1] = (cmds[-1][0], cmds[-1][0] - 0.9)  # one stale command
    frames = [(15.0 + k / 30, 15.0 + k / 30 - 0.005) for k in range(150)]
    raw = {"window": [15.0, 31.0], "statuses": [s.__dict__ for s in _statuses()],
           "commands": cmds, "cameras": {"third_person": frames, "wrist": frames[::2]},
           "states": [15.0 + k * 0.005 for k in range(1000)],
           "hybrid": [(16.0, 120.0, False), (17.0, 80.0, True), (40.0, 999.0, True)],
           "policy_before": {"refused[stale command]": "2"},
           "policy_after": {"refused[stale command]": "5", "decode_p50_ms": "100.0",
                            "decode_p99_ms": "160.0"},
           "sim_lines": [], "min_period_s": 0.1, "camera_period_s": 1 / 30}
    r = sg.method_report(raw)
    assert r["running_s"] == pytest.approx(14.0)  # 15..20 and 22..31
    assert r["commands"] == 140 and r["command_rate_hz"] == pytest.approx(10.0)
    assert r["command_age_ms"]["p50"] == pytest.approx(300.0)
    assert r["command_age_ms"]["max"] == pytest.approx(900.0)
    assert r["stall"]["max_gap_ms"] == pytest.approx(100.0)
    assert r["stall"]["step_p99_ms"] == 160.0
    assert r["stall"]["bound_ms"] == pytest.approx(293.33, abs=0.01) and r["stall"]["held"]
    assert r["cameras"]["third_person"]["rate_hz"] == pytest.approx(150 / 14.0)
    assert r["cameras"]["wrist"]["max_gap_ms"] == pytest.approx(2000 / 30)
    assert r["state"]["count"] == 1000
    assert r["node_step_ms"]["unverified_share"] == 0.5  # the step at 40 s is after the window
    assert r["held_by_reason"] == {"stale command": 3}
    assert r["episodes"]["ended"] == 2
    text = sg.format_markdown({"setup": {"date": "d", "task": "t", "sim_mode": "realtime",
                                         "time_scale": 1.0, "duration_s": 16.0, "db": "",
                                         "domain": 7},
                               "methods": {"drafter": r, "ar": {"error": "sim exited"}}})
    assert "| drafter | 14.0 | 10.00 |" in text and "100 / 293 held" in text
    assert "| ar | failed: sim exited |" in text
    raw["policy_after"] = {}  # no diagnostics: the HybridStep p99 sets the bound
    assert sg.method_report(raw)["stall"]["step_p99_source"] == "HybridStep total_ms p99"


def test_stamp_from_cdr():
    little = b"\x00\x01\x00\x00" + struct.pack("<iI", 5, 250_000_000) + b"rest"
    big = b"\x00\x00\x00\x00" + struct.pack(">iI", 7, 500_000_000)
    assert stamp_from_cdr(little) == pytest.approx(5.25)
    assert stamp_from_cdr(big) == pytest.approx(7.5)


def test_check_args():
    args = parse_args(["sim-graph", "--methods", "drafter,ar,drafter"])
    assert check_args(args) == ["drafter", "ar"]
    with pytest.raises(ValueError, match="--db"):
        check_args(parse_args(["sim-graph", "--methods", "heisd"]))
    with pytest.raises(ValueError, match="unknown method"):
        check_args(parse_args(["sim-graph", "--methods", "fast"]))


def test_short_run_of_the_real_graph(tmp_path):
    """The drafter method for 8 s: commands at the sim, both cameras streaming, no node died."""
    from test.node_process import repo_env
    from test.ros_env import require_ros

    require_ros()
    from rclpy.serialization import serialize_message
    from sensor_msgs.msg import Image

    msg = Image()
    msg.header.stamp.sec, msg.header.stamp.nanosec = 12, 345_000_000
    assert stamp_from_cdr(serialize_message(msg)) == pytest.approx(12.345)

    out = tmp_path / "sim_graph.json"
    proc = subprocess.run([sys.executable, "-m", "heisd_ros.tools.bench", "sim-graph",
                           "--methods", "drafter", "--duration-s", "8", "--json", str(out)],
                          capture_output=True, text=True, env=repo_env(), timeout=500)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    report = json.loads(out.read_text())["methods"]["drafter"]
    assert not report.get("error")
    assert report["commands"] > 0 and report["command_rate_hz"] > 0
    assert all(report["cameras"][c]["rate_hz"] > 0 for c in CAMERAS)
    assert report["state"]["rate_hz"] > 0
    assert "| drafter |" in proc.stdout
