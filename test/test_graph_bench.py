"""heisd-bench graph: the report's figures and the stamp -> observation mapping (no ROS graph).

The figures live in ``heisd_ros.tools.graph``: pure ones in ``figures``, the per-method report
and the Markdown in ``report``, the phases' helpers in ``phases`` and ``inprocess``, the
options in ``bench_cli``. Command age at the robot's rates (p50 / p99 / max, commands over
the policy's and the driver's limits) is one of them (``test_report_with_commands_...``).
"""

import math

import pytest

from heisd_ros.tools.graph import bench_cli, figures, inprocess, phases, report

HELD = ("[WARN] [{t}] [policy_node]: holding, no command: stale command: its frames were "
        "0.812 s old when the action was ready (max_command_age_s 0.4 s; decode took {ms} ms); "
        "not sent")


def test_summary_and_ratios():
    s = figures.summary([10.0, 20.0, 30.0, 40.0])
    assert s["n"] == 4 and s["p50"] == 25.0 and s["mean"] == 25.0 and s["max"] == 40.0
    assert 39.0 < s["p99"] <= 40.0
    assert figures.summary([]) is None
    assert figures.ratio(3.0, 2.0) == 1.5
    assert figures.ratio(None, 2.0) is None and figures.ratio(1.0, 0.0) is None
    assert figures.agree(1.05, 1.0) is True and figures.agree(1.2, 1.0) is False
    assert figures.agree(None, 1.0) is None


def test_indices_of_stamps_nearest_within_tolerance():
    published = [(1_000_000_000, 7), (1_033_333_333, 8), (1_066_666_667, 9)]
    # The node's stamps went through float seconds: a few hundred ns off.
    stamps = [1_033_333_100, 1_066_667_000, 999_999_900, 1_050_000_000, 2_000_000_000]
    assert figures.indices_of_stamps(published, stamps) == [8, 9, 7, None, None]
    assert figures.indices_of_stamps([], [1]) == [None]
    assert figures.stamp_ns(1, 5) == 1_000_000_005


def test_parse_held_decodes_in_window():
    lines = [HELD.format(t="100.5", ms=780), "[INFO] [101.0] [policy_node]: policy configured",
             HELD.format(t="102.25", ms=1210), HELD.format(t="110.0", ms=90),
             "[WARN] [103.0] [policy_node]: holding, no command: stale frames: 0.4 s old"]
    assert figures.parse_held_decodes(lines) == [780.0, 1210.0, 90.0]
    assert figures.parse_held_decodes(lines, 101.0, 105.0) == [1210.0]
    assert figures.count_log_lines(["[WARN] [5.0] [d]: controller watchdog_hold: x",
                               "[WARN] [9.0] [d]: controller watchdog_hold: x"],
                              "watchdog_hold", 4.0, 6.0) == 1


def test_counter_and_refusal_deltas():
    before = {"refused[stale command]": "3", "commands_received": "9", "method": "ar"}
    after = {"refused[stale command]": "10", "refused[stale frames]": "2",
             "refused[waiting for input]": "1", "commands_received": "19", "method": "ar"}
    before["refused[waiting for input]"] = "1"
    assert figures.held_by_reason(before, after) == {"stale command": 7, "stale frames": 2}
    assert figures.counter_deltas(before, after, "commands_") == {"commands_received": 10}


def test_publish_gaps():
    out = figures.publish_gaps([0.0, 0.1, 0.2, 0.5, 9.0], 0.0, 1.0)
    assert out["count"] == 4 and out["rate_hz"] == 4.0
    assert out["max_gap_ms"] == pytest.approx(300.0)


def _phase(**kw):
    phase = {"duration_s": 10.0, "ages_s": [], "hybrid_total_ms": [], "held_ms": [],
             "policy_before": {}, "policy_after": {}, "driver_before": {}, "driver_after": {}}
    phase.update(kw)
    return phase


def test_report_with_no_command_sent():
    phase = _phase(held_ms=[800.0, 1200.0, 1000.0],
                   policy_before={"refused[stale command]": "2"},
                   policy_after={"refused[stale command]": "5"})
    r = report.method_report(phase, {"wall_ms": [100.0, 100.0], "total_ms": [90.0, 90.0]},
                         0.4, 0.5)
    assert r["commands"] == 0 and r["command_rate_hz"] == 0.0
    assert r["node_wall_ms"]["p50"] == 1000.0 and r["node_wall_ms"]["source"].startswith("log")
    assert r["ratio_p50"] == pytest.approx(10.0)
    assert r["node_hybrid_total_ms"] is None and r["total_ratio_p50"] is None
    assert r["required_rate_hz"] == pytest.approx(8.0) and r["rate_pass"] is False
    assert r["age_ms"] is None and r["over_driver_limit"] == 0
    assert r["held_by_reason"] == {"stale command": 3}


def test_report_with_commands_prefers_diagnostics():
    phase = _phase(ages_s=[0.1, 0.2, 0.45, 0.6], hybrid_total_ms=[100.0, 110.0, 120.0, 130.0],
                   held_ms=[900.0],
                   policy_before={"decoded_steps": "3.000"},
                   policy_after={"decode_p50_ms": "150.0", "decode_p99_ms": "900.0",
                                 "decoded_steps": "8.000"},
                   driver_before={"commands_received": "1"},
                   driver_after={"commands_received": "5", "last_rejected_reason": "stale"})
    r = report.method_report(phase, {"wall_ms": [100.0] * 4, "total_ms": [100.0] * 4}, 0.4, 0.5)
    assert r["command_rate_hz"] == pytest.approx(0.4)
    assert r["over_policy_limit"] == 2 and r["over_driver_limit"] == 1
    assert r["age_ms"]["max"] == pytest.approx(600.0)
    wall = r["node_wall_ms"]
    assert wall["source"].startswith("diagnostics") and wall["p50"] == 150.0
    assert wall["before_window"] == 3  # 8 covered, 5 decoded in the window
    assert r["ratio_p99"] == pytest.approx(9.0)
    assert r["total_ratio_p50"] == pytest.approx(1.15)
    assert r["driver_commands"] == {"commands_received": 4}
    assert r["node_steps"] == {"sent": 4, "held_stale_logged": 1}


def test_heisd_vs_ar_and_markdown():
    def rep(rate, mean):
        return {"command_rate_hz": rate, "inprocess_wall_ms": {"mean": mean}}

    out = report.heisd_vs_ar({"ar": rep(2.0, 200.0), "heisd": rep(3.0, 125.0)})
    assert out["command_rate_ratio"] == 1.5 and out["inprocess_speed_ratio"] == 1.6
    assert out["agree"] is True
    assert report.heisd_vs_ar({"ar": rep(0.0, 200.0), "heisd": rep(0.0, 100.0)})["agree"] is None
    assert report.heisd_vs_ar({"ar": rep(1.0, 1.0)}) is None

    phase = _phase(held_ms=[800.0])
    ar = report.method_report(phase, {"wall_ms": [100.0], "total_ms": [100.0]}, 0.4, 0.5)
    result = {"setup": {"date": "d", "duration_s": 10.0, "camera_hz": 30.0, "state_hz": 200.0,
                        "image": "224 px", "observations": "synthetic", "domain": 201,
                        "threads": 1},
              "methods": {"ar": ar, "heisd": {"error": "not ready within 300 s"}},
              "heisd_vs_ar": None}
    text = report.format_markdown(result)
    assert "| ar | 800 / 800 | log |" in text
    assert "failed: not ready within 300 s" in text
    assert "n/a" in text and not math.isnan(ar["command_rate_hz"])


def test_inprocess_order():
    sent = {"hybrid_indices": [5, None, 9, 2], "held_ms": [1.0]}
    order, advance, how = inprocess.inprocess_order(sent, 10, 100)
    assert order == [5, 9, 2] and advance and "sent" in how
    held = {"hybrid_indices": [], "held_ms": [1.0, 2.0, 3.0], "start_index": 8}
    order, advance, _ = inprocess.inprocess_order(held, 10, 100)
    assert order == [8, 9, 0] and not advance


def test_parse_methods():
    class Args:
        methods, db = None, None

    assert bench_cli.parse_methods(Args()) == ["ar", "drafter"]
    Args.methods = "ar,heisd"
    with pytest.raises(ValueError, match="--db"):
        bench_cli.parse_methods(Args())
    Args.methods = "ar,nope"
    with pytest.raises(ValueError):
        bench_cli.parse_methods(Args())


def test_policy_overrides():
    assert phases.policy_overrides(["decode_worker=false", "max_command_age_s=0.6",
                                "model.threads=2", "task="]) == {
        "decode_worker": False, "max_command_age_s": 0.6, "model.threads": 2, "task": ""}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        phases.policy_overrides(["decode_worker"])


def test_normalise_status_groups_timings():
    deadline = ("retrieval deadline_exceeded: no answer from /retrieval_node/retrieve within "
                "{ms} ms; drafter mode")
    assert figures.normalise_status(deadline.format(ms="70.0")) == figures.normalise_status(
        deadline.format(ms="71.5")) == deadline.format(ms="N.N")
    assert figures.normalise_status("  retrieval absent: drafter ") == "retrieval absent: drafter"
    assert figures.normalise_status("") == ""


def test_status_counts_top_four_and_the_rest():
    statuses = (["retrieval empty: no candidates returned; drafter mode"] * 5
                + ["retrieval deadline_exceeded: within 70.0 ms; drafter mode",
                   "retrieval deadline_exceeded: within 69.9 ms; drafter mode"]
                + [""] * 2 + ["b"] + ["a"] + ["c"])
    out = figures.status_counts(statuses)
    assert out["top"] == [["retrieval empty: no candidates returned; drafter mode", 5],
                          ["", 2], ["retrieval deadline_exceeded: within N.N ms; drafter mode",
                                    2], ["a", 1]]  # ties alphabetically
    assert out["other"] == 2 and out["distinct"] == 6
    assert figures.status_counts([]) == {"top": [], "other": 0, "distinct": 0}


def test_step_sources_shares():
    out = figures.step_sources(["", "x", "x", ""], [2, 1, 1, 0], [True, False, False, False])
    assert out["steps"] == 4 and out["status"]["top"] == [["", 2], ["x", 2]]
    assert out["draft_source_share"] == {"retrieval": 0.25, "drafter": 0.5, "none": 0.25}
    assert out["verify_skipped_share"] == 0.25
    empty = figures.step_sources([], [], [])
    assert empty["draft_source_share"]["drafter"] is None and empty["verify_skipped_share"] is None


def test_phase_fault_only_for_methods_with_retrieval():
    class Args:
        retrieval_fault, fault_delay_s = "slow", 0.5

    with_db = {"retrieval": "r.yaml", "policy": "p.yaml"}
    assert phases.phase_fault("drafter", Args(), {"policy": "p.yaml"}) is None
    fault = phases.phase_fault("heisd", Args(), with_db)
    assert fault["mode"] == "slow" and "0.5 s" in fault["how"]
    Args.retrieval_fault = "none"
    assert phases.phase_fault("heisd", Args(), with_db) is None


def test_fault_drill_report_and_markdown():
    drafter = report.method_report(
        _phase(ages_s=[0.1] * 40, hybrid_total_ms=[100.0] * 40,
               hybrid_status=[""] * 40, hybrid_draft_source=[1] * 40,
               hybrid_verify_skipped=[False] * 40),
        {"wall_ms": [100.0] * 4, "total_ms": [100.0] * 4}, 0.4, 0.5)
    status = "retrieval empty: no candidates returned; drafter mode"
    heisd = report.method_report(
        _phase(ages_s=[0.1] * 36, hybrid_total_ms=[110.0] * 36, hybrid_status=[status] * 36,
               hybrid_draft_source=[1] * 36, hybrid_verify_skipped=[False] * 36,
               retrieval_fault={"mode": "empty", "how": "retrieval_fault: no candidates"}),
        {}, 0.4, 0.5)
    assert heisd["hybrid_steps"]["status"]["top"] == [[status, 36]]
    assert heisd["hybrid_steps"]["draft_source_share"]["drafter"] == 1.0
    assert heisd["inprocess_wall_ms"] is None and heisd["rate_pass"] is None
    reports = {"drafter": drafter, "heisd": heisd}
    assert report.rate_vs_drafter(reports) == {"heisd": pytest.approx(0.9)}
    result = {"setup": {"date": "d", "duration_s": 10.0, "camera_hz": 30.0, "state_hz": 200.0,
                        "image": "224 px", "observations": "demos", "domain": 201,
                        "threads": 1, "retrieval_fault": "empty"},
              "methods": reports, "heisd_vs_ar": None}
    text = report.format_markdown(result)
    assert "### HybridStep status by method" in text
    assert "| heisd (fault: empty) |" in text and report.FAULT_NA in text
    assert f"| 36 | 0% / 100% / 0% | 0% | 3.60 (0.90) | {status}: 36 |" in text
    assert "| drafter | - | 40 | 0% / 100% / 0% | 0% | 4.00 | (no status): 40 |" in text


def test_check_fault():
    class Args:
        retrieval_fault, fault_delay_s = "killed", 0.5

    bench_cli.check_fault(Args(), ["drafter", "heisd"])
    with pytest.raises(ValueError, match="uses retrieval"):
        bench_cli.check_fault(Args(), ["ar", "drafter"])
    Args.retrieval_fault, Args.fault_delay_s = "slow", -1.0
    with pytest.raises(ValueError, match="--fault-delay-s"):
        bench_cli.check_fault(Args(), ["heisd"])
    Args.retrieval_fault, Args.fault_delay_s = "none", 0.5
    bench_cli.check_fault(Args(), ["ar"])


def test_frame_clock_rate_runs_slow_steps_back_to_back_and_holds_fast_ones_to_the_camera():
    from heisd_ros.tools.graph.figures import frame_clock_rate_hz

    assert frame_clock_rate_hz([50.0] * 300, 30.0) == pytest.approx(20.0, rel=1e-3)
    assert frame_clock_rate_hz([40.0] * 300, 30.0) == pytest.approx(25.0, rel=1e-3)
    assert frame_clock_rate_hz([10.0] * 300, 30.0) == pytest.approx(30.0, rel=1e-2)
    # a fast step after a slow one starts at once on the frame that came meanwhile, then
    # waits for the next: two steps per two frame periods
    assert frame_clock_rate_hz([50.0, 10.0] * 150, 30.0) == pytest.approx(30.0, rel=1e-2)
    assert frame_clock_rate_hz([50.0, 10.0] * 150, 15.0) == pytest.approx(15.0, rel=1e-2)
    assert frame_clock_rate_hz([], 30.0) is None


def test_behind_counts_from_hybrid_steps():
    assert report.behind_counts([(0, 0.0), (0, 0.0)]) is None   # no check collected
    c = report.behind_counts([(0, 0.0), (1, 0.02), (2, 6.0), (1, 4.0)])
    assert c == {"collected": 3, "rejected": 1, "waited": 2, "wait_ms_p50": 5.0}
