"""The ``instruction_first`` prompt layout and the reuse of its head's keys/values.

A decode that starts with the instruction's keys/values cached must be the decode that runs
the whole prompt: the same greedy tokens as ``transformers``' generate, the same hidden states
for draft heads, the same cache after commits; and the reuse must notice new weights.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from heisd_ros.data.observation import Observation
from heisd_ros.decoding.acceptance import exact_rule
from heisd_ros.decoding.decoder import ActionDecoder
from heisd_ros.decoding.drafter_source import DrafterSource, DraftTreeConfig
from heisd_ros.decoding.hf_reference import hf_generate_action
from heisd_ros.models.draft_tree import DraftTree
from heisd_ros.models.small_vla import SmallVLA
from heisd_ros.models.target import Prefix
from heisd_ros.models.vocab import PAD_ID
from test.fixtures_decoding import TINY, scenes, train_drafter, train_tiny_vla

ATOL = 2e-5
HEAD_FIRST = dataclasses.replace(TINY, prompt_layout="instruction_first")


@pytest.fixture(scope="module")
def random_vla() -> SmallVLA:
    return SmallVLA.random(HEAD_FIRST, seed=1, lm_head_scale=4.0)


@pytest.fixture(scope="module")
def trained_vla() -> SmallVLA:
    return train_tiny_vla(SmallVLA.random(HEAD_FIRST, seed=2), scenes(48, seed=100), steps=100)


@pytest.fixture(params=["random", "trained"], scope="module")
def vla(request, random_vla, trained_vla):
    return random_vla if request.param == "random" else trained_vla


def without_reuse(prefix: Prefix) -> Prefix:
    return dataclasses.replace(prefix, static_length=0, static_key=None)


class ForwardCounter:
    """Counts forwards of the decoder stack (a hook on the real module)."""

    def __init__(self, vla: SmallVLA):
        self.count = 0
        self.handle = vla.language_model.model.register_forward_hook(self._hook)

    def _hook(self, *_):
        self.count += 1


def test_the_head_is_bos_and_the_padded_text_and_the_rest_is_per_step(random_vla):
    vla, obs = random_vla, scenes(1, seed=0)[0]
    ids = vla.prompt_ids(obs.instruction)
    assert len(ids) == 1 + HEAD_FIRST.text_slot
    assert vla.vocab.decode_text(ids) == f"In: {obs.instruction.lower()}\nOut:"
    assert ids[-1] == PAD_ID
    prefix = vla.encode(obs)
    assert prefix.static_length == len(ids) and prefix.static_key == tuple(ids)
    assert prefix.embeds.shape[1] == len(ids) + 2 * HEAD_FIRST.patches_per_camera
    torch.testing.assert_close(prefix.embeds[:, :len(ids)], vla.embed(ids))
    # Another instruction changes the head only (no FiLM: vision ignores the words).
    other = vla.encode(Observation(obs.image_primary, obs.image_wrist, "touch the blue block"))
    assert not torch.equal(other.embeds[:, :len(ids)], prefix.embeds[:, :len(ids)])
    torch.testing.assert_close(other.embeds[:, len(ids):], prefix.embeds[:, len(ids):])
    # The layout is part of a model's identity; the default layout is not written (old DBs
    # keep their fingerprints).
    assert "prompt_layout" not in TINY.identity_json()
    assert '"prompt_layout": "instruction_first"' in HEAD_FIRST.identity_json()
    with pytest.raises(ValueError, match="prompt_layout"):
        dataclasses.replace(TINY, prompt_layout="text_last")


def test_ar_with_a_reused_head_equals_transformers_generate(vla):
    ar = ActionDecoder(vla)
    for obs in scenes(8, seed=1):
        prefix = vla.encode(obs)
        reused, plain = ar.decode(obs, prefix), ar.decode(obs, without_reuse(prefix))
        np.testing.assert_array_equal(reused.tokens, hf_generate_action(vla, obs))
        np.testing.assert_array_equal(reused.tokens, plain.tokens)
        torch.testing.assert_close(reused.hidden, plain.hidden, atol=ATOL, rtol=1e-5)
        assert reused.stats.target_forwards == 7


def test_drafter_exact_equals_ar_with_a_reused_head(trained_vla):
    head = train_drafter(trained_vla, scenes(24, seed=200), steps=40)
    ar = ActionDecoder(trained_vla)
    sd = ActionDecoder(trained_vla, DrafterSource(head, trained_vla, DraftTreeConfig()),
                       exact_rule)
    for obs in scenes(8, seed=2):
        want, got = ar.decode(obs), sd.decode(obs)
        np.testing.assert_array_equal(got.tokens, want.tokens)
        # The draft head saw the whole prompt: the same drafts as without reuse.
        plain = sd.decode(obs, without_reuse(trained_vla.encode(obs)))
        np.testing.assert_array_equal(plain.tokens, got.tokens)
        assert plain.stats.accepted_lengths == got.stats.accepted_lengths


def reference(vla, prefix, tokens):
    """Hidden states and logits of prompt + tokens in one causal forward, no cache."""
    embeds = torch.cat([prefix.embeds, vla.embed(tokens)], dim=1)
    with torch.no_grad():
        hidden = vla.language_model.model(inputs_embeds=embeds).last_hidden_state[0]
    return hidden, vla.lm_head(hidden)


def test_first_forward_reports_the_whole_prompt_and_a_tree_rides_along(random_vla):
    vla = random_vla
    prefix = vla.encode(scenes(1, seed=4)[0])
    tree = DraftTree.chain(vla.actions.token_of_bin(np.array([10, 200, 37])))
    state = vla.start(prefix)
    assert state.cached_length == prefix.static_length
    out = vla.forward(state, tree)
    p = prefix.embeds.shape[1]
    hidden, logits = reference(vla, prefix, [int(t) for t in tree.tokens])
    assert out.context_hidden.shape == (p, vla.hidden_size)
    torch.testing.assert_close(out.context_hidden, hidden[:p], atol=ATOL, rtol=1e-5)
    torch.testing.assert_close(out.context_embeds, prefix.embeds)
    torch.testing.assert_close(out.last_logits, logits[p - 1], atol=ATOL, rtol=1e-5)
    torch.testing.assert_close(out.tree_logits, logits[p:], atol=ATOL, rtol=1e-5)
    # Later forwards report only their own positions.
    vla.commit(state, out, [0], int(vla.actions.token_of_bin(5)))
    assert vla.forward(state).context_hidden.shape == (1, vla.hidden_size)


def test_cache_after_commits_equals_a_fresh_prefill(random_vla):
    vla, rng = random_vla, np.random.default_rng(0)
    prefix = vla.encode(scenes(1, seed=6)[0])
    state, committed = vla.start(prefix), []
    for round_ in range(3):
        tree = (DraftTree.chain(vla.actions.token_of_bin(rng.integers(0, 256, 2))) if round_
                else DraftTree.empty())
        out = vla.forward(state, tree)
        path = list(range(len(tree)))[:round_]
        bonus = int(vla.actions.token_of_bin(int(rng.integers(256))))
        vla.commit(state, out, path, bonus)
        accepted = [int(tree.tokens[i]) for i in path]
        fresh = DynamicCache(config=vla.language_model.config)
        with torch.no_grad():
            vla.language_model.model(
                inputs_embeds=torch.cat([prefix.embeds, vla.embed(committed + accepted)], 1),
                past_key_values=fresh, use_cache=True)
        for ours, theirs in zip(state.cache.layers, fresh.layers, strict=True):
            torch.testing.assert_close(ours.keys, theirs.keys, atol=ATOL, rtol=1e-5)
            torch.testing.assert_close(ours.values, theirs.values, atol=ATOL, rtol=1e-5)
        committed += accepted + [bonus]


def test_the_head_runs_once_per_instruction_and_again_after_new_weights():
    vla = SmallVLA.random(HEAD_FIRST, seed=3, lm_head_scale=4.0)
    vla.prompt_head_capacity = 2
    frames = scenes(3, seed=7)
    instructions = ["pick the red block", "pick the blue block", "push the green block"]
    obs = [Observation(f.image_primary, f.image_wrist, text)
           for f, text in zip(frames, instructions, strict=True)]
    ar, counter = ActionDecoder(vla), ForwardCounter(vla)
    ar.decode(obs[0])
    assert counter.count == 1 + 7                 # the head, then the 7 AR forwards
    ar.decode(Observation(frames[1].image_primary, None, instructions[0]))
    assert counter.count == 1 + 7 + 7             # a new frame, the same instruction
    ar.decode(obs[1])
    ar.decode(obs[2])                             # capacity 2: the first head is dropped
    assert counter.count == 3 * (1 + 7) + 7
    ar.decode(obs[0])
    assert counter.count == 4 * (1 + 7) + 7
    # Weights changed in place (an optimiser step): the head is computed again, and the
    # decode is the new model's.
    with torch.no_grad():
        vla.language_model.model.layers[0].mlp.down_proj.weight.mul_(-1.0)
    result = ar.decode(obs[0])
    assert counter.count == 5 * (1 + 7) + 7
    np.testing.assert_array_equal(result.tokens, hf_generate_action(vla, obs[0]))
    counter.handle.remove()


def test_a_bad_prompt_head_is_refused(random_vla):
    embeds = torch.zeros(1, 5, 4)
    for bad in (-1, 5, 9):
        with pytest.raises(ValueError, match="static_length"):
            Prefix(embeds, torch.zeros(2, 3), static_length=bad, static_key="x")
    with pytest.raises(ValueError, match="static_key"):
        Prefix(embeds, torch.zeros(2, 3), static_length=2)
