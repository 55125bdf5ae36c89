"""Evaluation library without a simulator: Wilson, projection, agreement, registry, reports."""

from __future__ import annotations

import numpy as np
import pytest

from heisd_ros.decoding.builder import DecoderResources
from heisd_ros.decoding.methods import METHODS
from heisd_ros.eval import metrics, report
from heisd_ros.eval.closed_loop import late_rows
from heisd_ros.eval.methods import MethodContext, build_method, check_methods
from heisd_ros.eval.projection import project
from heisd_ros.latency import DecisionCounters, LatencyProfile


@pytest.mark.parametrize(("wins", "n", "low", "high"), [
    (0, 10, 0.0, 0.2775), (5, 10, 0.2366, 0.7634), (10, 10, 0.7225, 1.0),
    (8, 10, 0.4902, 0.9433), (1, 1, 0.2065, 1.0), (18, 20, 0.6990, 0.9721)])
def test_wilson_interval_known_values(wins, n, low, high):
    lo, hi = metrics.wilson_interval(wins, n)
    assert lo == pytest.approx(low, abs=1e-4) and hi == pytest.approx(high, abs=1e-4)


def test_wilson_interval_edge_cases():
    assert metrics.wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError, match="successes"):
        metrics.wilson_interval(3, 2)


def _steps(*counters: DecisionCounters) -> list[dict]:
    return [{"counters": c.to_dict()} for c in counters]


def test_projection_is_the_mean_of_each_actions_priced_counters():
    profile = LatencyProfile(name="p", vision_ms=8.0, prefill_base_ms=20.0, forward_base_ms=10.0,
                             drafter_forward_ms=1.0, retrieval_ms=5.0, overhead_ms=50.0)
    ar = DecisionCounters(vision=1, forwards=((30, 0),) + ((1, 0),) * 6)
    verified = DecisionCounters(vision=1, forwards=((30, 14), (1, 0)), drafter_forwards=2,
                                retrievals=1)
    skipped = DecisionCounters(vision=1, retrievals=1, unverified=True, check=(30, 7))
    # AR: 8 + 20 + 6 * 10 + 50 = 138; verified: 8 + 20 + 10 + 2 + 5 + 50 = 95; skipped: 63.
    out = project({"ar": _steps(ar, ar), "heisd": _steps(verified, skipped)}, profile)
    assert "PROJECTION" in out["label"] and out["profile"] == "p"
    heisd = out["methods"]["heisd"]
    assert heisd["projected_ms_per_action"] == pytest.approx((95 + 63) / 2)
    assert heisd["projected_speedup_vs_ar"] == pytest.approx(138 / 79)
    assert out["methods"]["ar"]["projected_speedup_vs_ar"] == pytest.approx(1.0)
    assert heisd["skip_rate"] == 0.5 and heisd["target_forwards_per_action"] == 1.0
    assert heisd["parts_ms"]["retrieval"] == 5.0
    assert any("check behind" in a for a in out["assumptions"])
    # Without an AR row there is no speed-up; the paper's profile is the default.
    alone = project({"heisd": _steps(verified)})["methods"]["heisd"]
    assert alone["projected_speedup_vs_ar"] is None
    assert "<" not in report.projection_markdown(project({"heisd": _steps(verified)}))
    with pytest.raises(ValueError, match="neither a shipped profile"):
        project({"ar": _steps(ar)}, "no-such-profile")


def test_agreement_metrics():
    ref = np.array([[10, 20, 30, 40, 50, 60, 255], [0, 0, 0, 0, 0, 0, 0]])
    bins = ref.copy()
    bins[0, 0] += 2
    bins[1, 6] = 255
    ref_actions = np.zeros((2, 7))
    actions = ref_actions.copy()
    actions[0, :3] = [0.003, 0.004, 0.0]  # 5 mm
    actions[1, 6] = 1.0
    out = metrics.agreement(bins, ref, actions, ref_actions)
    assert out["exact_token_rate"] == pytest.approx(12 / 14)
    assert out["exact_action_rate"] == 0.0
    assert out["mean_bin_deviation_per_dim"][0] == 1.0
    assert out["mean_bin_deviation_per_dim"][6] == 127.5
    assert out["translation_error_mm"] == {"mean": pytest.approx(2.5), "max": pytest.approx(5.0)}
    assert out["gripper_agreement"] == 0.5
    with pytest.raises(ValueError, match="bins"):
        metrics.agreement(bins[:, :3], ref[:, :3])


def _step(fwd, rounds, mode="off", skipped=False, ms=10.0):
    return {"target_forwards": fwd, "drafter_forwards": 2, "retrieval_calls": 0,
            "accepted_lengths": rounds, "tokens_from_draft": sum(rounds), "router_mode": mode,
            "verify_skipped": skipped, "stage_ms": {"vision": 1.0, "total": ms}}


def _run(rules, bins):
    """Step records of one episode: rule "" = verified, else the unverified step's rule."""
    return [{"verify_skipped": bool(rule), "bins": list(b),
             "hybrid": {"skip_rule": rule, "unverified_run": 0}}
            for rule, b in zip(rules, bins, strict=True)]


def test_unverified_counters_count_runs_per_episode_and_the_step_after():
    a, b = [10] * 7, [10, 12, 10, 10, 10, 10, 10]
    first = _run(["", "follow", "follow", "", "router", ""], [a, a, a, b, a, a])
    second = _run(["follow", "similarity", "follow", ""], [a, a, a, a])  # run of 3, then same
    out = metrics.unverified_summary([first, second])
    assert out["unverified_share"] == pytest.approx(6 / 10)
    assert out["longest_unverified_run"] == 3
    assert out["unverified_by_rule"] == pytest.approx({"follow": 0.4, "router": 0.1,
                                                       "similarity": 0.1})
    after = out["after_skip"]  # pairs: (a, b), (a, a), (a, a)
    assert after["count"] == 3 and after["exact_action_rate"] == pytest.approx(2 / 3)
    assert after["mean_bin_deviation"] == pytest.approx(2 / 6 / 3)
    assert after["gripper_agreement"] == 1.0
    # A run does not continue into the next episode.
    ends = _run(["", "follow", "follow"], [a, a, a])
    starts = _run(["follow", ""], [a, b])
    assert metrics.unverified_summary([ends, starts])["longest_unverified_run"] == 2
    assert metrics.unverified_summary([]) == {}


def test_counters_latency_and_speedup():
    steps = [_step(3, [3, 2], "drafter"), _step(0, [], "retrieval", True, 20.0),
             _step(4, [1], "drafter", ms=30.0)]
    c = metrics.counters_summary(steps)
    assert c["al"] == pytest.approx(2.0) and c["target_forwards_per_action"] == pytest.approx(7 / 3)
    assert c["skip_rate"] == pytest.approx(1 / 3)
    assert c["router_share"] == {"drafter": pytest.approx(2 / 3), "retrieval": pytest.approx(1 / 3)}
    assert metrics.stage_breakdown(steps) == {"vision": 1.0, "total": 20.0}
    lat = metrics.latency_summary([10.0, 20.0, 30.0])
    assert lat["p50_ms"] == 20.0 and 29.0 < lat["p99_ms"] <= 30.0
    assert metrics.speedup([10.0, 10.0], [30.0, 30.0]) == pytest.approx(3.0)
    # Bimodal latencies: the median shows the fast mode, the mean the rate over the run.
    fast_slow, ref = [10.0, 10.0, 10.0, 50.0, 50.0], [30.0] * 5
    assert metrics.speedup(fast_slow, ref) == pytest.approx(3.0)
    assert metrics.speedup_mean(fast_slow, ref) == pytest.approx(30.0 / 26.0)


def test_method_registry_names_and_errors():
    assert {"ar", "drafter", "drafter_relaxed", "heisd", "router_skip"} <= set(METHODS)
    assert check_methods(["drafter", "ar", "drafter"]) == ["ar", "drafter"]
    assert check_methods(["drafter"]) == ["ar", "drafter"]
    with pytest.raises(ValueError, match="unknown method 'nope'; valid: ar, "):
        check_methods(["nope"])
    with pytest.raises(ValueError, match="needs a drafter"):
        build_method("drafter", MethodContext(DecoderResources(object())))


def test_report_files_and_tables(tmp_path):
    table = report.format_table(["a", "bb"], [["1", "2"], ["333", "4"]])
    assert table.splitlines()[0].startswith("a    bb")
    assert "\\|" in report.markdown_table(["mean |d|"], [["x"]])
    images = [
        report.plot_trajectories(tmp_path / "t.png", {"ar": [(np.random.rand(5, 3),
                                                             ["off"] * 5)]}, "t"),
        report.plot_latency(tmp_path / "l.png", {"ar": [1.0, 2.0]}, "l"),
        report.plot_accepted_lengths(tmp_path / "h.png", {"ar": [], "d": [1, 2, 2]}, "h"),
        report.plot_quality_vs_speed(tmp_path / "q.png", {"ar": (1.0, 0.5, 0.2, 0.8)}, "SR", "q")]
    md = report.write_markdown(tmp_path / "report.md", "T", [("S", "body")], images)
    assert all(p.stat().st_size > 1000 for p in images)
    assert "![t](t.png)" in md.read_text()
    assert report.write_json(tmp_path / "x" / "r.json", {"a": np.float32(1.5)}).is_file()


def test_real_time_steps_by_kind_of_decision():
    def step(late, period, **fields):
        return {"rt_late": late, "rt_world_latency_ms": 170.0 if late else 66.0,
                "rt_period_ms": period, "verify_skipped": False, "draft_source": "",
                "target_forwards": 7, "hybrid": None, **fields}

    steps = [step(False, 100.0, verify_skipped=True, target_forwards=0),
             step(True, 200.0),
             step(True, 200.0, draft_source="drafter", target_forwards=4),
             step(False, 100.0, draft_source="retrieval", target_forwards=1),
             step(True, 133.3, draft_source="retrieval", target_forwards=1,
                  hybrid={"skip_rule": "deadline"}),
             step(True, 166.7, draft_source="ar+retrieval", target_forwards=5),
             step(False, None, draft_source="retrieval", target_forwards=1)]
    kinds = [metrics.step_kind(s) for s in steps]
    assert kinds == ["unverified", "AR", "draft head", "retrieval draft, one forward",
                     "completed at the deadline", "retrieval draft, more forwards",
                     "retrieval draft, one forward"]
    by = metrics.real_time_by_kind(steps)
    assert list(by) == [k for k in metrics.STEP_KINDS if k in kinds]   # the reports' order
    assert sum(k["steps"] for k in by.values()) == len(steps)
    one = by["retrieval draft, one forward"]
    assert one["steps"] == 2 and one["share"] == pytest.approx(2 / 7)
    assert one["late_share"] == 0.0 and one["period_ms_mean"] == 100.0   # the last has none
    assert by["AR"]["late_share"] == 1.0 and by["AR"]["command_age_ms_mean"] == 170.0
    summary = metrics.real_time_summary([1.0], [len(steps)], steps)["real_time"]
    assert summary["by_step_kind"] == by
    header, rows = late_rows({"heisd_deadline": {"real_time": summary}, "ar": {}})
    assert len(rows) == len(by) and rows[0][:4] == ["heisd_deadline", "unverified", "1 (14%)",
                                                    "0%"]
    assert ["heisd_deadline", "AR", "1 (14%)", "100%", "170.0", "200.0"] in rows
