"""The shipped small VLA and its draft head load, carry their statistics and decode."""

from __future__ import annotations

import json

import numpy as np
import pytest

from heisd_ros.actions.normalization import ActionCodec
from heisd_ros.data.observation import Observation
from heisd_ros.decoding.decoder import ActionDecoder
from heisd_ros.decoding.drafter_source import DrafterSource
from heisd_ros.models.checkpoint import load_draft_head, load_small_vla
from heisd_ros.models.loading import DEFAULT_TARGET_PATH

ASSETS = DEFAULT_TARGET_PATH.parent


def shipped_card() -> dict:
    return json.loads((ASSETS / "small_vla_card.json").read_text())


def observation() -> Observation:
    rng = np.random.default_rng(0)
    return Observation(image_primary=rng.integers(0, 255, (128, 128, 3), dtype=np.uint8),
                       image_wrist=rng.integers(0, 255, (128, 128, 3), dtype=np.uint8),
                       instruction="put the red block on the plate",
                       proprio=np.zeros(7, np.float32))


def test_shipped_small_vla_decodes_with_its_own_statistics():
    vla = load_small_vla(DEFAULT_TARGET_PATH)
    assert vla.action_stats is not None, "the shipped checkpoint must carry action_stats"
    codec = vla.codec
    result = ActionDecoder(vla, codec=codec).decode(observation())
    assert result.bins.shape == (7,) and ((0 <= result.bins) & (result.bins < 256)).all()
    np.testing.assert_allclose(result.action, ActionCodec(vla.action_stats).decode(result.bins))
    assert np.all(np.isfinite(result.action)) and result.action[-1] in (0.0, 1.0)


def test_shipped_draft_head_matches_the_shipped_target():
    vla = load_small_vla(DEFAULT_TARGET_PATH)
    head = load_draft_head(ASSETS / "draft_head.safetensors", vla)
    obs = observation()
    ar = ActionDecoder(vla).decode(obs)
    sd = ActionDecoder(vla, DrafterSource(head, vla)).decode(obs)
    np.testing.assert_array_equal(ar.tokens, sd.tokens)   # exact acceptance is lossless


def test_card_reports_what_was_measured():
    card = shipped_card()
    assert card["commands"] and card["final_validation"]["token_acc"] > 0
    closed = card["closed_loop_ar"]
    assert 0 <= closed["mean_over_suites"] <= 1
    assert (ASSETS / "small_vla.safetensors").stat().st_size < 50e6


@pytest.mark.parametrize("run", ["closed_loop_20_per_task_hybrid",
                                 "closed_loop_20_per_task_shipped_default"])
def test_card_hybrid_comparison_agrees_with_its_ar_run(run):
    """Greedy AR is deterministic, so each hybrid run's AR column must repeat closed_loop_ar."""
    from heisd_ros.eval.metrics import wilson_interval

    card = shipped_card()
    hybrid = card[run]["suites"]
    for suite, methods in hybrid.items():
        if suite != "all":
            assert methods["ar"]["successes"] == card["closed_loop_ar"][suite]["successes"]
        for row in methods.values():
            assert row["success_rate"] == row["successes"] / row["episodes"]
            np.testing.assert_allclose(row["sr_wilson95"],
                                       wilson_interval(row["successes"], row["episodes"]))


def test_shipped_model_fingerprint_is_the_one_its_db_was_built_with():
    """Fields added to the config later (FiLM, off) must not orphan DBs built before them."""
    from heisd_ros.retrieval.embedding import model_fingerprint

    card = shipped_card()
    vla = load_small_vla(DEFAULT_TARGET_PATH)
    assert vla.config.instruction_film == 0
    assert model_fingerprint(vla) == card["calibration"]["model_fingerprint"]


def test_shipped_model_carries_the_gripper_rule_its_card_reports():
    card = shipped_card()
    vla = load_small_vla(DEFAULT_TARGET_PATH)
    assert vla.gripper_switch_probability == card["gripper_rule"]["gripper_switch_probability"]
