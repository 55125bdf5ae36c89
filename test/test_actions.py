"""Action tokens: OpenVLA bins and ids, q01/q99 normalisation, gripper handling, groups."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from heisd_ros.actions import (
    ACTION_GROUPS,
    GRIPPER_DIM,
    ActionCodec,
    ActionStats,
    ActionTokenMap,
    bins_to_values,
    group_of_dim,
    group_spans,
    values_to_bins,
)

OPENVLA = ActionTokenMap(vocab_base=32000)
BIN_WIDTH = 2.0 / 255  # spacing of OpenVLA's 256 edges over [-1, 1]


def test_openvla_id_layout():
    assert OPENVLA.token_of_bin(0) == 31999
    assert OPENVLA.token_of_bin(255) == 31744
    assert OPENVLA.first_id == 31744
    assert OPENVLA.bin_of_token(31999) == 0 and OPENVLA.bin_of_token(31744) == 255
    assert OPENVLA.bin_of_token(31743) == -1 and OPENVLA.bin_of_token(32000) == -1
    ids = np.array([31743, 31744, 31999, 32000, 5])
    assert OPENVLA.bin_of_token(ids).tolist() == [-1, 255, 0, -1, -1]
    assert OPENVLA.bin_of_token(torch.as_tensor(ids)).tolist() == [-1, 255, 0, -1, -1]


def test_openvla_binning_edges():
    # OpenVLA: digitize(-1) = 1 -> bin 0; digitize(1) = 256 -> bin 255, decoded like bin 254.
    assert values_to_bins(np.array([-1.0, 1.0, -5.0, 5.0])).tolist() == [0, 255, 0, 255]
    assert bins_to_values(np.array([255]))[0] == pytest.approx(bins_to_values(np.array([254]))[0])
    assert bins_to_values(np.array([0]))[0] == pytest.approx(-1 + BIN_WIDTH / 2)
    with pytest.raises(ValueError, match="bins"):
        bins_to_values(np.array([256]))


@settings(max_examples=200, deadline=None)
@given(st.floats(-1.0, 1.0, allow_nan=False))
def test_bin_roundtrip_within_half_a_bin(value):
    back = bins_to_values(values_to_bins(np.array([value])))[0]
    assert abs(back - value) <= BIN_WIDTH / 2 + 1e-12


def test_argmax_restricted_to_action_ids_and_ties_go_to_lowest_id():
    vocab = ActionTokenMap(vocab_base=515)
    logits = torch.zeros(576)
    logits[500] = 50.0                # an action id (259..514)
    logits[100] = 99.0                # a byte id: never chosen
    logits[520] = 99.0                # a padding id past vocab_base: never chosen
    assert int(vocab.argmax_token(logits)) == 500
    flat = torch.zeros(576)
    assert int(vocab.argmax_token(flat)) == vocab.first_id  # tie -> lowest id (= bin 255)
    assert int(vocab.argmax_bin(flat)) == 255


def test_token_map_validation():
    with pytest.raises(ValueError, match="vocab_base"):
        ActionTokenMap(vocab_base=100)
    with pytest.raises(ValueError, match="n_bins"):
        ActionTokenMap(vocab_base=1000, n_bins=128)


def test_normalisation_roundtrip_and_gripper():
    stats = ActionStats()
    action = np.array([0.01, -0.015, 0.0, 0.1, -0.05, 0.0, 1.0])
    normalised = stats.normalise(action)
    assert normalised[-1] == 1.0           # gripper passes through un-normalised
    np.testing.assert_allclose(stats.unnormalise(normalised)[:6], action[:6], atol=1e-7)
    assert stats.unnormalise(normalised)[-1] == 1.0
    assert stats.unnormalise(np.array([0, 0, 0, 0, 0, 0, 0.3]))[-1] == 0.0   # binarised open
    assert stats.unnormalise(np.array([0, 0, 0, 0, 0, 0, 0.7]))[-1] == 1.0
    assert stats.normalise(np.array([1.0, -1.0, 0, 0, 0, 0, 0]))[:2].tolist() == [1.0, -1.0]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-1, 1), min_size=6, max_size=6), st.booleans())
def test_codec_roundtrip_within_quantisation(unit, closed):
    stats = ActionStats()
    action = np.array(unit + [1.0 if closed else 0.0]) * np.r_[stats.q99[:6], 1.0]
    decoded = ActionCodec(stats).decode(ActionCodec(stats).encode(action))
    scale = (stats.q99 - stats.q01)[:6] / 2
    assert np.all(np.abs(decoded[:6] - action[:6]) <= scale * BIN_WIDTH + 1e-9)
    assert decoded[GRIPPER_DIM] == action[GRIPPER_DIM]


def test_stats_validation_and_json():
    with pytest.raises(ValueError, match="q01"):
        ActionStats(q01=[0.0] * 6)
    with pytest.raises(ValueError, match="q99"):
        ActionStats(q01=[1.0] * 6 + [0.0], q99=[0.0] * 7)
    with pytest.raises(ValueError, match="mask"):
        ActionStats(mask=[True] * 7)
    stats = ActionStats.from_actions(np.random.default_rng(0).normal(0, 0.01, (100, 7)))
    again = ActionStats.from_json(stats.to_json())
    np.testing.assert_allclose(again.q99, stats.q99)
    assert again.q01[-1] == 0.0 and again.q99[-1] == 1.0


def test_a_smaller_stats_quantile_leaves_fewer_actions_in_the_edge_bins():
    """1% per side in one clipped bin is a spike a greedy decoder picks; 0.1% is not."""
    actions = np.random.default_rng(1).standard_t(3, (20000, 7)) * 0.01
    actions[:, 6] = actions[:, 6] > 0
    edge_share = {}
    for q in (0.01, 0.001):
        codec = ActionCodec(ActionStats.from_actions(actions, quantile=q))
        bins = np.stack([codec.encode(a) for a in actions[:4000]])[:, :6]
        edge_share[q] = float(np.mean((bins == 0) | (bins == 255)))
    assert 0.01 < edge_share[0.01] < 0.03 and edge_share[0.001] < 0.004
    with pytest.raises(ValueError, match="quantile"):
        ActionStats.from_actions(actions, quantile=0.5)


def test_kinematic_groups_partition_the_action():
    dims = sorted(d for g in ACTION_GROUPS.values() for d in g)
    assert dims == list(range(7))
    assert group_of_dim(2) == "position" and group_of_dim(5) == "rotation"
    assert group_of_dim(GRIPPER_DIM) == "gripper"
    assert group_spans() == [("position", 0, 3), ("rotation", 3, 6), ("gripper", 6, 7)]
    with pytest.raises(ValueError, match="dim"):
        group_of_dim(7)
