"""The target's gripper decision rule: the gripper as a binary variable, lossless under it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from heisd_ros.actions.bins import bins_to_values
from heisd_ros.actions.normalization import ActionStats
from heisd_ros.data.observation import EpisodeState
from heisd_ros.decoding.decoder import ActionDecoder
from heisd_ros.decoding.draft_source import DraftSource
from heisd_ros.decoding.drafter_source import DrafterSource
from heisd_ros.decoding.hybrid import HybridConfig, HybridDecoder
from heisd_ros.decoding.retrieval_source import RetrievalSource, RetrievalSourceConfig
from heisd_ros.models.checkpoint import (
    check_gripper_switch_probability,
    load_small_vla,
    save_small_vla,
)
from heisd_ros.models.draft_tree import DraftTree
from test.fixtures_decoding import scenes
from test.test_hybrid_helpers import STRAIGHT_FAST, ScriptedClient, candidate, ok, router

GRIPPER = 6
OPEN_BIN, CLOSED_BINS = 0, (255, 254, 250)


@pytest.fixture
def with_rule():
    """Sets a model's rule for one test and restores it (the model fixtures are shared)."""
    changed = []

    def set_rule(vla, p):
        changed.append((vla, vla.gripper_switch_probability))
        vla.gripper_switch_probability = p
        return vla

    yield set_rule
    for vla, old in reversed(changed):
        vla.gripper_switch_probability = old


def logits_with(vla, probs: dict[int, float]) -> torch.Tensor:
    """(V,) logits whose softmax over the action ids puts ``probs`` on those bins."""
    logits = torch.full((vla.config.model_vocab_size,), -1e4)
    for b, p in probs.items():
        logits[vla.actions.token_of_bin(b)] = float(np.log(p))
    return logits


def test_closing_bins_are_those_the_codec_decodes_closed(tiny_random_vla):
    closing = tiny_random_vla._closing_bins()
    decoded = np.array([tiny_random_vla.codec.decode(np.full(7, b))[GRIPPER] for b in range(256)])
    np.testing.assert_array_equal(closing, decoded == 1.0)
    assert closing[max(CLOSED_BINS)] and not closing[OPEN_BIN]
    assert bins_to_values(np.flatnonzero(closing)).min() > 0.5


def test_without_a_rule_every_dim_is_plain_argmax(tiny_random_vla):
    vla = tiny_random_vla
    assert vla.gripper_switch_probability is None
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(14, vla.config.model_vocab_size, generator=generator)
    dims = np.arange(14) % 7
    np.testing.assert_array_equal(vla.greedy_bins(logits, dims),
                                  vla.actions.argmax_bin(logits).numpy())


def test_the_state_changes_on_the_other_states_total_probability(tiny_random_vla,
                                                                  with_rule):
    vla = tiny_random_vla
    # The single most likely bin closes (0.45) but opening bins hold 0.55 together.
    split_open = logits_with(vla, {OPEN_BIN: 0.25, 1: 0.15, 2: 0.15, CLOSED_BINS[0]: 0.45})
    # The single most likely bin opens (0.55); closing bins hold 0.45 together.
    split_closed = logits_with(vla, {OPEN_BIN: 0.55, 255: 0.2, 254: 0.15, 250: 0.1})
    both = torch.stack([split_open, split_closed])
    g = [GRIPPER, GRIPPER]
    argmax = [255, OPEN_BIN]
    assert vla.greedy_bins(both, g, gripper_closed=False).tolist() == argmax  # no rule
    with_rule(vla, 0.5)
    assert vla.greedy_bins(both, g).tolist() == argmax  # state unknown: plain greedy
    # Open now: close only when closing holds >= p in total.
    assert vla.greedy_bins(both, g, gripper_closed=False).tolist() == [OPEN_BIN, OPEN_BIN]
    # Closed now: open when opening holds >= p in total (0.55 here).
    assert vla.greedy_bins(both, g, gripper_closed=True).tolist() == [OPEN_BIN, OPEN_BIN]
    with_rule(vla, 0.4)
    assert vla.greedy_bins(both, g, gripper_closed=False).tolist() == [255, 255]
    assert vla.greedy_bins(both, g, gripper_closed=True).tolist() == [OPEN_BIN, OPEN_BIN]
    with_rule(vla, 0.6)
    assert vla.greedy_bins(both, g, gripper_closed=True).tolist() == [255, 255]  # stays
    # Only the gripper dimension is ruled: the same rows at dim 0 stay argmax.
    with_rule(vla, 0.4)
    assert vla.greedy_bins(both, [0, GRIPPER], gripper_closed=False).tolist() == [255, 255]
    assert vla.greedy_token(split_closed, GRIPPER, False) == vla.actions.token_of_bin(255)
    assert vla.greedy_token(split_closed, 3, False) == vla.actions.token_of_bin(OPEN_BIN)


def with_state(observations):
    """The observations with a known gripper state, alternating open and closed."""
    return [replace(obs, episode=EpisodeState(None, i, float(i % 2)))
            for i, obs in enumerate(observations)]


def _noisy_client(seed: int) -> ScriptedClient:
    rng = np.random.default_rng(seed)

    def make(_embedding):
        cands = [rng.integers(0, 256, 7) for _ in range(3)]
        for c in cands:
            c[GRIPPER] = rng.choice([OPEN_BIN, CLOSED_BINS[0]])
        return ok([candidate(c, 0.9, i) for i, c in enumerate(cands)])

    return ScriptedClient(make)


@pytest.mark.parametrize("method", ["drafter", "retrieval", "router_only"])
def test_lossless_methods_equal_ar_under_the_rule(tiny_random_vla, tiny_drafter,
                                                  with_rule, method):
    vla = tiny_random_vla
    observations = with_state(scenes(6, seed=21))
    plain = [ActionDecoder(vla).decode(obs).tokens for obs in observations]
    with_rule(vla, 0.2)  # a random model gives closing ~1/4: the rule changes state often
    ruled = [ActionDecoder(vla).decode(obs).tokens for obs in observations]
    assert any(p[GRIPPER] != r[GRIPPER] for p, r in zip(plain, ruled, strict=True)), \
        "the rule must change a gripper decision here, or this test cannot fail"
    rs = RetrievalSourceConfig(deadline_s=0.5)
    hybrid = HybridDecoder(vla, HybridConfig(method=method, retrieval=rs),
                           drafter=DrafterSource(tiny_drafter, vla),
                           retrieval=RetrievalSource(_noisy_client(3), vla.actions.vocab_base, rs),
                           router=router(0.0) if method == "router_only" else None)
    for obs, want in zip(observations, ruled, strict=True):
        got = hybrid.decode(obs, ee_positions_m=STRAIGHT_FAST)
        np.testing.assert_array_equal(got.tokens, want)


def test_a_checkpoint_carries_its_rule(tiny_trained_vla, tmp_path):
    plain = save_small_vla(tiny_trained_vla, tmp_path / "plain.safetensors")
    assert load_small_vla(plain).gripper_switch_probability is None
    ruled = save_small_vla(tiny_trained_vla, tmp_path / "ruled.safetensors",
                           extra={"gripper_switch_probability": 0.4})
    assert load_small_vla(ruled).gripper_switch_probability == pytest.approx(0.4)
    bad = save_small_vla(tiny_trained_vla, tmp_path / "bad.safetensors",
                         extra={"gripper_switch_probability": 1.5})
    with pytest.raises(ValueError, match="gripper_switch_probability"):
        load_small_vla(bad)


def test_setting_the_rule_keeps_the_weights_bit_for_bit(tiny_trained_vla, tmp_path):
    from safetensors.torch import load_file, save_file

    from heisd_ros.models.checkpoint import set_gripper_switch_probability
    from heisd_ros.retrieval.embedding import model_fingerprint

    stats = ActionStats.from_actions(np.random.default_rng(0).normal(0, 0.01, (50, 7)))
    path = save_small_vla(tiny_trained_vla, tmp_path / "m.safetensors",
                          extra={"action_stats": stats.to_json()})
    before = load_file(str(path))
    set_gripper_switch_probability(path, 0.4)
    loaded = load_small_vla(path)
    assert loaded.gripper_switch_probability == pytest.approx(0.4)
    assert loaded.action_stats.to_json() == stats.to_json()
    after = load_file(str(path))
    assert sorted(after) == sorted(before)
    assert all(torch.equal(after[k], before[k]) for k in before)
    assert model_fingerprint(loaded) == model_fingerprint(load_small_vla(path))
    set_gripper_switch_probability(path, "none")
    assert load_small_vla(path).gripper_switch_probability is None
    with pytest.raises(ValueError, match="gripper_switch_probability"):
        set_gripper_switch_probability(path, 2.0)
    other = tmp_path / "other.safetensors"
    save_file({"w": torch.zeros(2)}, str(other), metadata={"format": "something-else"})
    with pytest.raises(ValueError, match="format"):
        set_gripper_switch_probability(other, 0.4)


@pytest.mark.parametrize("value, want", [(None, None), ("none", None), ("0.35", 0.35), (0.5, 0.5)])
def test_rule_values(value, want):
    assert check_gripper_switch_probability(value) == want


@pytest.mark.parametrize("value", ["0", "1", "-0.2", "abc", "nan"])
def test_rule_values_out_of_range_are_refused(value):
    with pytest.raises(ValueError, match="--gripper-switch-prob"):
        check_gripper_switch_probability(value, "--gripper-switch-prob")


class _ChainSource(DraftSource):
    """Drafts the rest of a fixed action (after the prefill), as a chain."""

    name = "chain"

    def __init__(self):
        self.tokens = None

    def propose(self, context):
        return DraftTree.chain(self.tokens[len(context.action_tokens):])


def test_a_draft_of_the_plain_greedy_gripper_is_rejected(tiny_random_vla, with_rule):
    vla = tiny_random_vla
    observations = with_state(scenes(6, seed=21))
    plain = [ActionDecoder(vla).decode(obs).tokens for obs in observations]
    with_rule(vla, 0.2)
    source = _ChainSource()
    decoder = ActionDecoder(vla, source)
    differs = 0
    for obs, draft in zip(observations, plain, strict=True):
        source.tokens = draft
        got = decoder.decode(obs)
        np.testing.assert_array_equal(got.tokens, ActionDecoder(vla).decode(obs).tokens)
        np.testing.assert_array_equal(got.tokens[:GRIPPER], draft[:GRIPPER])
        differs += int(got.tokens[GRIPPER] != draft[GRIPPER])
    assert differs, "no gripper decision changed: this test could not fail"


def test_replay_threads_each_methods_own_gripper_decision(tiny_random_vla, tiny_drafter,
                                                         with_rule):
    from heisd_ros.eval.replay import replay_frames

    vla = with_rule(tiny_random_vla, 0.2)
    frames = scenes(8, seed=5)
    want, gripper = [], None   # closed loop's bookkeeping, by hand
    for t, obs in enumerate(frames):
        obs = replace(obs, episode=EpisodeState(None, t, gripper))
        result = ActionDecoder(vla).decode(obs)
        want.append(result.tokens.tolist())
        gripper = float(result.action[GRIPPER])
    stateless = [ActionDecoder(vla).decode(obs).tokens.tolist() for obs in frames]
    assert want != stateless, "the state must change a decision here, or this test cannot fail"
    decoders = {"ar": ActionDecoder(vla), "drafter": ActionDecoder(vla, DrafterSource(tiny_drafter,
                                                                                      vla))}
    out = replay_frames(decoders, frames)
    for name in decoders:
        assert [f["methods"][name]["tokens"] for f in out] == want, name
