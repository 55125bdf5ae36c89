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
