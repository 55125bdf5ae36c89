"""StageClock: per-stage milliseconds on the CPU (perf_counter) and on CUDA (events)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from heisd_ros.decoding import stats
from heisd_ros.decoding.stats import STAGES, StageClock
from test.polling import ManualClock


def test_cpu_stages_add_up_to_total_with_overhead(monkeypatch):
    perf_counter = ManualClock()
    monkeypatch.setattr(stats, "time", SimpleNamespace(perf_counter=perf_counter))
    clock = StageClock("cpu")
    with clock.stage("vision"):
        perf_counter.advance(0.020)
    with clock.stage("verify"):
        perf_counter.advance(0.010)
    perf_counter.advance(0.004)  # between two stages: overhead
    with clock.stage("verify"):
        perf_counter.advance(0.010)
    perf_counter.advance(0.006)  # after the last stage: overhead
    ms = clock.finish()
    assert set(ms) == set(STAGES)
    assert ms == pytest.approx({"vision": 20.0, "retrieval": 0.0, "prefill": 0.0, "draft": 0.0,
                                "verify": 20.0, "overhead": 10.0, "total": 50.0})
    staged = sum(ms[k] for k in ("vision", "retrieval", "prefill", "draft", "verify"))
    assert ms["total"] == pytest.approx(staged + ms["overhead"])


@pytest.mark.parametrize("name", ["total", "overhead", "decode"])
def test_unknown_or_derived_stage_is_refused(name):
    clock = StageClock("cpu")
    with pytest.raises(ValueError, match="stage"):
        with clock.stage(name):
            pass


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_events_charge_gpu_work_to_its_stage():
    device = torch.device("cuda")
    x = torch.randn(2048, 2048, device=device)
    clock = StageClock(device)
    with clock.stage("verify"):
        for _ in range(20):
            x = x @ x
            x = x / x.norm()
    ms = clock.finish()
    assert ms["verify"] > 0.0
    assert ms["total"] >= ms["verify"]


def test_path_costs_warm_both_then_take_the_cheaper_and_re_measure_the_other():
    from heisd_ros.decoding.stats import PathCosts

    costs = PathCosts(warm=2, explore_every=5, alpha=0.5)
    chosen = []
    for _ in range(4):  # warm-up: each path twice, the least measured first
        path = costs.choose()
        chosen.append(path)
        costs.record(path, 30.0 if path == "drafter" else 20.0)
    assert sorted(chosen) == ["ar", "ar", "drafter", "drafter"]
    assert costs.mean_ms == {"drafter": 30.0, "ar": 20.0}
    picks = [costs.choose() for _ in range(10)]  # choices 5..14: the 5th, 10th re-measure
    assert picks == ["drafter", "ar", "ar", "ar", "ar", "drafter", "ar", "ar", "ar", "ar"]
    costs.record("ar", 60.0)                      # AR got slower: 20 + 0.5 * 40 = 40
    costs.record("ar", float("nan"))              # a failed measurement changes nothing
    assert costs.mean_ms["ar"] == 40.0 and costs.samples["ar"] == 3
    assert [costs.choose(), costs.choose()] == ["ar", "drafter"]  # the 15th re-measures AR
    assert costs.describe() == "drafter 30.0 ms, ar 40.0 ms"
    with pytest.raises(ValueError, match="PathCosts"):
        PathCosts(alpha=0.0)


def test_path_costs_with_three_paths_re_measure_the_least_recently_taken():
    from heisd_ros.decoding.stats import PathCosts

    costs = PathCosts(warm=1, explore_every=3, alpha=1.0, paths=("a", "b", "c"))
    for path, ms in (("a", 5.0), ("b", 7.0), ("c", 9.0)):
        assert costs.choose() == path   # warm-up in order: each is the least measured
        costs.record(path, ms)
    picks = [costs.choose() for _ in range(6)]   # choices 4..9: the 6th and 9th explore
    assert picks == ["a", "a", "b", "a", "a", "c"]
    with pytest.raises(ValueError, match="distinct paths"):
        PathCosts(paths=("a", "a"))
