"""StageClock: per-stage milliseconds on the CPU (perf_counter) and on CUDA (events)."""

from __future__ import annotations

import time

import pytest
import torch

from heisd_ros.decoding.stats import STAGES, StageClock


def test_cpu_stages_add_up_to_total_with_overhead():
    clock = StageClock("cpu")
    with clock.stage("vision"):
        time.sleep(0.02)
    with clock.stage("verify"):
        time.sleep(0.01)
    with clock.stage("verify"):
        time.sleep(0.01)
    time.sleep(0.01)  # outside any stage: overhead
    ms = clock.finish()
    assert set(ms) == set(STAGES)
    assert ms["vision"] >= 20.0 and ms["verify"] >= 20.0
    assert ms["prefill"] == ms["draft"] == ms["retrieval"] == 0.0
    staged = sum(ms[k] for k in ("vision", "retrieval", "prefill", "draft", "verify"))
    assert ms["total"] == pytest.approx(staged + ms["overhead"])
    assert ms["overhead"] >= 10.0


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
