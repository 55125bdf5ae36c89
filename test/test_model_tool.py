"""heisd-model: a checkpoint's gripper rule set from the command line, and what it reports."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from heisd_ros.actions.normalization import ActionStats
from heisd_ros.models.checkpoint import load_small_vla, save_small_vla
from heisd_ros.models.small_vla import SmallVLA
from heisd_ros.retrieval.embedding import model_fingerprint
from heisd_ros.tools import model as model_tool
from test.test_vla_training import TINY


@pytest.fixture
def checkpoint(tmp_path):
    """A tiny small-VLA checkpoint with action statistics and no gripper rule."""
    stats = ActionStats.from_actions(np.random.default_rng(0).normal(0, 0.01, (50, 7)))
    return save_small_vla(SmallVLA.random(TINY, seed=0), tmp_path / "m.safetensors",
                          extra={"action_stats": stats.to_json()})


def test_set_gripper_rule_changes_what_load_small_vla_reports(checkpoint, capsys):
    from safetensors.torch import load_file

    before = load_file(str(checkpoint))
    fingerprint = model_fingerprint(load_small_vla(checkpoint))
    assert load_small_vla(checkpoint).gripper_switch_probability is None
    assert model_tool.main(["set-gripper-rule", str(checkpoint), "0.4"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["gripper_switch_probability"] == pytest.approx(0.4)
    loaded = load_small_vla(checkpoint)
    assert loaded.gripper_switch_probability == pytest.approx(0.4)
    assert loaded.action_stats is not None
    # Metadata only: the tensors and so the fingerprint (DB, calibration) are unchanged.
    after = load_file(str(checkpoint))
    assert sorted(after) == sorted(before)
    assert all(torch.equal(after[k], before[k]) for k in before)
    assert model_fingerprint(loaded) == fingerprint == printed["fingerprint"]
    assert model_tool.main(["set-gripper-rule", str(checkpoint), "none"]) == 0
    assert load_small_vla(checkpoint).gripper_switch_probability is None


@pytest.mark.parametrize("value", ["1.5", "0", "often"])
def test_set_gripper_rule_refuses_a_bad_probability_and_leaves_the_checkpoint(checkpoint,
                                                                             value, capsys):
    assert model_tool.main(["set-gripper-rule", str(checkpoint), "0.3"]) == 0
    capsys.readouterr()
    assert model_tool.main(["set-gripper-rule", str(checkpoint), value]) == 2
    assert "P: expected a probability in (0, 1)" in capsys.readouterr().err
    assert load_small_vla(checkpoint).gripper_switch_probability == pytest.approx(0.3)


def test_model_info_reports_the_checkpoint(checkpoint, tmp_path, capsys):
    assert model_tool.main(["info", str(checkpoint)]) == 0
    info = json.loads(capsys.readouterr().out)
    vla = load_small_vla(checkpoint)
    assert info["config"] == json.loads(vla.config.to_json())
    assert info["parameters"] == sum(p.numel() for p in vla.net.parameters())
    assert info["action_stats"] is True and info["gripper_switch_probability"] is None
    assert info["fingerprint"] == model_fingerprint(vla)
    assert model_tool.main(["info", str(tmp_path / "missing.safetensors")]) == 2
    assert "not found" in capsys.readouterr().err
