"""The open-loop grounding probes on piper_object (heisd_ros.eval.grounding)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from heisd_ros.eval.grounding import OBJECTS, first_action_alignment, pathway_probe
from heisd_ros.models.small_vla import SmallVLA
from heisd_ros.models.subgoal import SCALE_M
from heisd_ros.sim.config import SimConfig
from heisd_ros.sim.env import PiperSimEnv
from heisd_ros.sim.suites import get_task
from test.test_vla_training import TINY_STEM


def test_first_action_alignment_scores_every_instruction_of_every_scene():
    vla = SmallVLA.random(TINY_STEM, seed=0, lm_head_scale=8.0)
    result = first_action_alignment(vla, seeds=[100, 101], image_size_px=32)
    assert len(result["cases"]) == 2 * len(OBJECTS)
    assert {c["object"] for c in result["cases"]} == set(OBJECTS)
    cosines = [c["cosine"] for c in result["cases"]]
    assert all(-1.0 <= c <= 1.0 for c in cosines)
    assert result["mean_cosine"] == pytest.approx(np.mean(cosines))


def test_pathway_probe_finds_the_object_a_pathway_points_at():
    vla = SmallVLA.random(TINY_STEM, seed=0).with_subgoal_pathway(8)
    with pytest.raises(ValueError, match="no subgoal pathway"):
        pathway_probe(SmallVLA.random(TINY_STEM, seed=0), seeds=[100], image_size_px=32)
    # A head that always predicts "stay here": the hit is the object nearest the hand, and the
    # distance is the hand's distance to the named object.
    with torch.no_grad():
        for layer in vla.net.subgoal.head:
            if isinstance(layer, torch.nn.Linear):
                layer.weight.zero_()
                layer.bias.zero_()
    result = pathway_probe(vla, seeds=[100], image_size_px=32)
    assert result["cases"] == len(OBJECTS) and result["hits"] == 1
    with PiperSimEnv(get_task("piper_object", "red_block_in_basket"),
                     SimConfig(image_width_px=32, image_height_px=32)) as env:
        env.reset(100)
        hand = env.robot_state().ee_position_m[:2]
        gaps_m = [np.linalg.norm(env.body_pos(name)[:2] - hand) for name in OBJECTS]
    assert result["median_distance_mm"] == pytest.approx(1000 * np.median(gaps_m), abs=1e-3)
    # Pointing 1 m away along x: no object is within reach of that point.
    with torch.no_grad():
        vla.net.subgoal.head[-1].bias[0] = 1.0 / SCALE_M
    assert pathway_probe(vla, seeds=[100], image_size_px=32)["median_distance_mm"] > 500
