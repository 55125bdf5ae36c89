"""heisd-bench soak: the window figures and the verdict, its /proc samples, one short run.

The maths (``heisd_ros.tools.graph.soak_report``, ``sr`` below) is fed synthetic records;
the /proc sampler reads this process and a child of it; one short run starts the real graph.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from heisd_ros.tools.bench import parse_args
from heisd_ros.tools.graph import soak_report as sr
from heisd_ros.tools.graph.listener import Status
from heisd_ros.tools.graph.soak import check_args
from heisd_ros.tools.graph.soak_procs import LogScanner, ProcessSampler, read_proc

A = ("piper_goal", "red_block_on_plate", 0, 0)
B = ("piper_goal", "red_block_on_plate", 1, 1)
MIB = 1024  # KiB


def _raw(start_s=100.0, end_s=120.0, rate_hz=10.0, rss_mib=(200, 210), **changes) -> dict:
    """A 20 s window: episode A runs on from before it and ends (success) 10 s in.

    B starts 12 s in; ``rate_hz`` commands 150 ms old while they run, two in the pause.
    """
    t0 = start_s
    times = [t / rate_hz for t in range(round(start_s * rate_hz), round(end_s * rate_hz))]
    running = [t for t in times if t <= t0 + 10.0 or t >= t0 + 12.0]
    raw = {"start_s": start_s, "end_s": end_s,
           "commands": [(t, t - 0.15) for t in running] + [(t0 + 10.5, t0 + 10.4),
                                                          (t0 + 11.0, t0 + 10.9)],
           "carried": Status(t0 - 5.0, A, 40, False),
           "statuses": [Status(t0 + 10.0, A, 150, True, True, "success"),
                        Status(t0 + 12.0, B, 0, False)],
           "step_statuses": ["drafter 12 ms", "drafter 15 ms", ""],
           "policy_before": {"refused[stale command]": "3"},
           "policy_after": {"refused[stale command]": "5", "refused[waiting for input]": "1"},
           "processes": {"policy": [(start_s, 7, rss_mib[0] * MIB, 10.0),
                                    (end_s, 7, rss_mib[1] * MIB, 15.0)]},
           "tracebacks": {"policy": 0, "sim": 0}, "events": [],
           "sim_before": _sim_counters(refused=4), "sim_after": _sim_counters(refused=6)}
    raw.update(changes)
    return raw


def _sim_counters(refused=0, past=0, limit_s=0.5) -> dict:
    """The sim node's /diagnostics command counters (strings, as received)."""
    return {"steps_run": "100", "commands_ignored": "0", "commands_refused_age": str(refused),
            "commands_executed_past_age": str(past), "max_executed_age_ms": "312.5",
            "max_command_age_s": str(limit_s)}


def test_process_figures_count_cpu_within_one_pid_and_restarts():
    fig = sr.process_figures([(0.0, 7, 100 * MIB, 1.0), (10.0, 7, 300 * MIB, 6.0),
                              (20.0, 7, 200 * MIB, 8.0)])
    assert fig == {"pid": 7, "rss_mib": 200.0, "rss_max_mib": 300.0, "cpu_pct": 35.0,
                   "restarts": 0}
    # restarted between 10 and 15 s: that span's CPU time is not a difference of one process
    fig = sr.process_figures([(0.0, 7, MIB, 1.0), (10.0, 7, MIB, 2.0), (15.0, 9, MIB, 0.1),
                              (25.0, 9, MIB, 2.1)])
    assert fig["restarts"] == 1 and fig["pid"] == 9
    assert fig["cpu_pct"] == pytest.approx(100.0 * 3.0 / 20.0)
    assert sr.process_figures([(0.0, 7, MIB, 1.0)])["cpu_pct"] is None
    assert sr.process_figures([]) is None


def test_window_figures_from_synthetic_records():
    w = sr.window_figures(_raw(), age_limit_s=0.4)
    assert w["window_s"] == 20.0 and w["running_s"] == pytest.approx(18.0)
    # 101 commands in 100..110 s, 80 in 112..119.9 s, 2 in the pause
    assert w["commands"] == 183 and w["commands_while_running"] == 181
    assert w["command_rate_hz"] == pytest.approx(181 / 18.0)
    assert w["command_rate_wall_hz"] == pytest.approx(183 / 20.0)
    assert w["command_age_ms"]["p50"] == pytest.approx(150.0)
    assert w["arrived_past_age_limit"] == 0
    assert w["sim"] == {"refused_for_age": 2, "executed_past_age_limit": 0,
                        "max_executed_age_ms": 312.5, "age_limit_s": 0.5}
    assert w["held_by_reason"] == {"stale command": 2, "waiting for input": 1}
    assert w["step_status"]["top"][0] == ["drafter N ms", 2]
    assert w["episodes"] == {"ended": 1, "successes": 1, "reasons": {"success": 1},
                             "commands": [150]}
    assert w["processes"]["policy"]["cpu_pct"] == pytest.approx(25.0)
    # two commands 0.5 s old while B runs arrived past the limit; one in the pause does not
    old = _raw()
    old["commands"] += [(115.0, 114.5), (116.0, 115.5), (111.5, 110.0)]
    w = sr.window_figures(old, age_limit_s=0.4)
    assert w["arrived_past_age_limit"] == 2 and w["command_age_ms"]["max"] == pytest.approx(500.0)
    assert sr.window_figures(_raw(sim_after={}), 0.4)["sim"] is None  # the sim said nothing
    # no status ever (the sim never said): the whole window counts as running
    none = sr.window_figures(_raw(carried=None, statuses=[]), age_limit_s=0.4)
    assert none["running_s"] == 20.0 and none["commands_while_running"] == 183


def test_verdict_passes_a_steady_soak():
    windows = [sr.window_figures(_raw(100.0 + 20 * k, 120.0 + 20 * k,
                                      rss_mib=(200, 205 + k)), 0.4) for k in range(4)]
    verdict = sr.soak_verdict(windows)
    assert verdict["passed"], sr.format_verdict(verdict)
    assert [c["ok"] for c in verdict["checks"]] == [True] * 5
    text = sr.format_verdict(verdict)
    assert text.endswith("soak PASSED") and "policy +1.5%" in text  # 208 vs 205 MiB


def test_verdict_fails_and_names_each_broken_goal():
    first = sr.window_figures(_raw(), 0.4)
    raw = _raw(200.0, 220.0, rate_hz=8.0, rss_mib=(200, 240),
               tracebacks={"policy": 1, "sim": 0}, events=["sim exited with code 1"])
    raw["commands"] = [(t, t - (0.5 if k % 50 == 0 else 0.15))  # 3 of 145 too old
                       for k, (t, _) in enumerate(raw["commands"])]
    raw["sim_before"], raw["sim_after"] = _sim_counters(6), _sim_counters(7, past=3)
    last = sr.window_figures(raw, 0.4)
    verdict = sr.soak_verdict([first, last])
    assert not verdict["passed"]
    assert [c["ok"] for c in verdict["checks"]] == [False] * 5
    text = sr.format_verdict(verdict)
    assert "FAIL: command rate of the last window within 10% of the first" in text
    # 145 commands in 18 s of episodes vs 181; 240 vs 210 MiB
    assert "(-19.9%)" in text and "policy +14.3%" in text
    assert "FAIL: 0 tracebacks: 1" in text
    assert "FAIL: 0 commands executed past the age limit: 3 (the sim's count, limit 0.5 s" in text
    assert "sim exited with code 1" in text and text.endswith("soak FAILED")
    # a rate that cannot be known fails too; so does a soak without windows
    silent = sr.window_figures(_raw(commands=[]), 0.4)
    assert not sr.soak_verdict([silent, silent])["checks"][0]["ok"]
    assert not sr.soak_verdict([])["passed"]
    # without the sim's counters (or with its check off) the age goal is unknown: it fails
    blind = sr.window_figures(_raw(sim_after={}), 0.4)
    assert not sr.soak_verdict([first, blind])["checks"][3]["ok"]


def test_markdown_has_a_table_per_window():
    windows = [sr.window_figures(_raw(100.0 + 20 * k, 120.0 + 20 * k), 0.4) for k in range(2)]
    result = {"setup": {"date": "d", "method": "heisd", "task": "t", "db": "db",
                        "duration_s": 40.0, "window_s": 20.0, "logs": "logs"},
              "windows": windows, "verdict": sr.soak_verdict(windows)}
    text = sr.format_markdown(result)
    assert "### window 1: 0.0-0.3 min" in text and "### window 2: 0.3-0.7 min" in text
    assert text.count("| process | pid |") == 2
    assert "| cmd/s over running time / over the window | 10.06 / 9.15 |" in text
    assert "| policy | 7 | 210 (210) | 25.0 | 0 |" in text and "soak PASSED" in text


def test_log_scanner_reads_each_complete_line_once(tmp_path):
    log = tmp_path / "policy.log"
    log.write_text("[INFO] ok\nTraceback (most recent call last):\n  File")
    scanner = LogScanner({"policy": log, "late": tmp_path / "late.log"})
    assert scanner.count("Traceback") == {"policy": 1, "late": 0}
    with open(log, "a") as f:
        f.write(' "x.py"\nTraceback (most recent call last):\n')
    assert scanner.count("Traceback") == {"policy": 1, "late": 0}
    assert scanner.count("Traceback") == {"policy": 0, "late": 0}


def test_process_sampler_reads_proc_of_a_process_and_its_child():
    me = read_proc(os.getpid())
    assert me is not None and me[0] > 0 and me[1] > 0
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        sampler = ProcessSampler({"me": os.getpid()})
        samples = sampler.sample(time.time())
        names = [n for n, s in samples.items() if s[1] == child.pid]
        assert len(names) == 1 and names[0].startswith("me/"), samples
        assert samples[names[0]][2] > 0 and samples["me"][2] > 0
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    assert names[0] not in sampler.sample(time.time())
    assert sampler.take_events() == [f"{names[0]} (pid {child.pid}) is gone"]


def test_check_args():
    assert check_args(parse_args(["soak", "--method", "drafter", "--duration-min", "60"])) == (
        "drafter", 3600.0, 300.0)
    assert check_args(parse_args(["soak", "--method", "ar", "--duration-s", "10",
                                  "--window-s", "5"])) == ("ar", 10.0, 5.0)
    with pytest.raises(ValueError, match="--db"):
        check_args(parse_args(["soak"]))  # heisd uses retrieval
    with pytest.raises(ValueError, match="--window-min"):
        check_args(parse_args(["soak", "--method", "ar", "--duration-min", "1",
                               "--window-min", "2"]))
    with pytest.raises(ValueError, match="--method: one method"):
        check_args(parse_args(["soak", "--method", "ar,heisd"]))
    with pytest.raises(ValueError, match="--duration-min"):
        check_args(parse_args(["soak", "--method", "ar", "--duration-min", "0"]))


def test_short_soak_of_the_real_graph(tmp_path):
    """HeiSD (an empty DB: it runs as drafter SD) for two 5 s windows through the CLI."""
    from test.node_process import repo_env
    from test.ros_env import require_ros

    require_ros()
    (tmp_path / "db").mkdir()
    out = tmp_path / "soak"
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "heisd_ros.tools.bench", "soak", "--db",
                           str(tmp_path / "db"), "--duration-s", "10", "--window-s", "5",
                           "--out", str(out)],
                          capture_output=True, text=True, env=repo_env(), timeout=500)
    print(f"\nSOAK short run: {time.monotonic() - started:.1f} s")
    log = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode in (0, 1), log  # 1: a verdict that failed on a loaded machine
    result = json.loads((out / "soak.json").read_text())
    windows = result["windows"]
    assert len(windows) == 2, log
    for w in windows:
        assert w["commands"] > 0, log
        assert {"policy", "retrieval", "sim"} <= set(w["processes"]), w["processes"]
        assert all(p["rss_mib"] > 0 for p in w["processes"].values()), w["processes"]
        assert not w["events"] and not any(w["tracebacks"].values()), log
    assert (out / "soak.md").read_text().count("| process | pid |") == 2
    assert ("soak PASSED" in proc.stdout) == (proc.returncode == 0)
