"""heisd-bench: the decode table/JSON and the cost profile (no assertions on wall-clock)."""

import json

import numpy as np
import pytest
import torch

from heisd_ros.decoding.bench_runner import BenchRecord, summarise
from heisd_ros.decoding.decoder import ActionResult
from heisd_ros.decoding.stats import StepStats
from heisd_ros.models.checkpoint import save_draft_head, save_small_vla
from heisd_ros.models.synthetic_scenes import SyntheticScenes
from heisd_ros.tools import bench
from test.fixtures_decoding import TINY


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_trained_vla, tiny_drafter):
    root = tmp_path_factory.mktemp("bench")
    target = save_small_vla(tiny_trained_vla, root / "vla.safetensors", dtype="float32")
    head = save_draft_head(tiny_drafter, root / "head.safetensors", tiny_trained_vla)
    return target, head, root


def test_decode_bench_json_and_table(files, capsys):
    target, head, root = files
    out = root / "bench.json"
    assert bench.main(["decode", "--target", str(target), "--drafter", str(head),
                       "--observations", "4", "--warmup", "1", "--seed", "3",
                       "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    modes = result["modes"]
    assert list(modes) == ["ar", "drafter", "drafter_relaxed"]  # the method table's names
    ar, exact, relaxed = modes["ar"], modes["drafter"], modes["drafter_relaxed"]
    assert ar["target_forwards_per_action"] == 7 and ar["al"] == 1.0
    assert ar["speedup_vs_ar"] == 1.0 and ar["agreement_with_ar"]["exact_token_rate"] == 1.0
    assert exact["agreement_with_ar"]["exact_token_rate"] == 1.0       # lossless
    assert exact["target_forwards_per_action"] < 7 and exact["al"] > 1
    for mode in modes.values():
        assert mode["actions"] == 4
        assert mode["ms_per_action"]["p90"] >= mode["ms_per_action"]["median"] > 0
        assert len(mode["agreement_with_ar"]["mean_bin_deviation_per_dim"]) == 7
        assert set(mode["stage_ms_median"]) >= {"vision", "prefill", "draft", "verify", "overhead"}
    assert relaxed["target_forwards_per_action"] <= 7
    assert result["relaxed_radius_bins"] == [9, 9, 9, 9, 9, 9, 0]
    table = capsys.readouterr().out
    assert "drafter_relaxed" in table and "speed-up" in table


def test_profile(files, tiny_trained_vla):
    target, head, root = files
    out = root / "profile.json"
    assert bench.main(["profile", "--target", str(target), "--drafter", str(head),
                       "--repeats", "2", "--json", str(out)]) == 0
    profile = json.loads(out.read_text())
    for key in ("vision_ms", "prefill_ms", "decode_forward_ms", "tree16_forward_ms",
                "draft_head_4_nodes_ms", "draft_over_target_forward", "vision_share_of_ar"):
        assert profile[key] > 0, key
    # What was profiled: the whole target, on the prompt of the seed-0 scene.
    vla = tiny_trained_vla
    assert profile["target_parameters"] == sum(p.numel() for p in vla.net.parameters())
    instruction = SyntheticScenes(1, seed=0).scene(0).instruction
    text = len(vla.prompt_ids(instruction)) - 1  # without bos
    assert profile["prompt_tokens"] == 1 + 2 * TINY.patches_per_camera + text
    # The estimate and the ratios follow from the timings: vision, prefill (the first token)
    # and one decode forward for each of the other six tokens.
    ar_ms = profile["vision_ms"] + profile["prefill_ms"] + 6 * profile["decode_forward_ms"]
    assert profile["ar_action_ms_estimate"] == pytest.approx(ar_ms)
    assert profile["vision_share_of_ar"] == pytest.approx(profile["vision_ms"] / ar_ms)
    assert profile["vision_share_of_ar"] < 1
    assert profile["draft_over_target_forward"] == pytest.approx(
        profile["draft_head_4_nodes_ms"] / profile["decode_forward_ms"])


def fake_result(bins, total_ms, forwards, lengths):
    stats = StepStats(target_forwards=forwards, accepted_lengths=lengths)
    stats.stage_ms["total"] = total_ms
    bins = np.asarray(bins)
    return ActionResult(tokens=bins, bins=bins, action=np.zeros(7), hidden=torch.zeros(7, 1),
                        vision_features=torch.zeros(2, 1), stats=stats)


def test_summary_arithmetic():
    records = [BenchRecord("ar", 0, fake_result([1] * 7, 100.0, 7, [])),
               BenchRecord("ar", 1, fake_result([2] * 7, 120.0, 7, [])),
               BenchRecord("x", 0, fake_result([1] * 7, 50.0, 2, [6])),
               BenchRecord("x", 1, fake_result([2] * 6 + [5], 60.0, 3, [3, 3]))]
    s = summarise(records)
    assert s["x"]["speedup_vs_ar"] == pytest.approx(110.0 / 55.0)
    assert s["x"]["al"] == pytest.approx(4.0) and s["x"]["target_forwards_per_action"] == 2.5
    assert s["x"]["agreement_with_ar"]["exact_token_rate"] == pytest.approx(13 / 14)
    assert s["x"]["agreement_with_ar"]["mean_bin_deviation_per_dim"] == [0] * 6 + [1.5]
    with pytest.raises(ValueError, match="reference"):
        summarise(records, reference="nope")
