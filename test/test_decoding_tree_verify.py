"""Tree verification: one tree forward == each path alone; commit == fresh prefill.

One forward with a tree mask gives each node the logits of running its root path alone, and
after a commit the KV cache equals a fresh prefill of prompt + accepted tokens.
"""

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from heisd_ros.models.draft_tree import DraftTree
from heisd_ros.models.small_vla import SmallVLA
from heisd_ros.models.small_vla_config import SmallVLAConfig
from test.fixtures_decoding import TINY, scenes

ATOL = 2e-5


def random_tree(vla, rng, n=12, max_depth=5) -> DraftTree:
    parents, depth = [], []
    for i in range(n):
        options = [-1] + [j for j in range(i) if depth[j] < max_depth - 1]
        p = int(rng.choice(options))
        parents.append(p)
        depth.append(0 if p < 0 else depth[p] + 1)
    tokens = vla.actions.token_of_bin(rng.integers(0, 256, n))
    return DraftTree(tokens, np.array(parents))


def reference(vla, prefix, tokens):
    """Plain causal forward of prompt + tokens without a cache: (hidden, logits) rows."""
    embeds = torch.cat([prefix.embeds, vla.embed(tokens)], dim=1)
    with torch.no_grad():
        out = vla.language_model.model(inputs_embeds=embeds)
        hidden = out.last_hidden_state[0]
    return hidden, vla.lm_head(hidden)


def leaves(tree):
    return [i for i in range(len(tree)) if i not in set(tree.parents.tolist())]


def check_paths(vla, prefix, committed, tree, out):
    """Every root-to-leaf path alone gives the tree forward's logits at its nodes."""
    p = prefix.embeds.shape[1] + len(committed)
    for leaf in leaves(tree):
        path = tree.path_to(leaf)
        hidden, logits = reference(vla, prefix, committed + [int(tree.tokens[i]) for i in path])
        torch.testing.assert_close(out.last_logits, logits[p - 1], atol=ATOL, rtol=1e-5)
        for j, node in enumerate(path):
            torch.testing.assert_close(out.tree_logits[node], logits[p + j], atol=ATOL, rtol=1e-5)
            torch.testing.assert_close(out.tree_hidden[node], hidden[p + j], atol=ATOL, rtol=1e-5)


@pytest.fixture(params=["eager", "sdpa"], scope="module")
def vla(request, tiny_random_vla):
    if request.param == "eager":
        return tiny_random_vla
    config = SmallVLAConfig(**{**TINY.__dict__, "attn_implementation": "sdpa"})
    return SmallVLA.random(config, seed=1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tree_forward_equals_each_path_alone(vla, seed):
    rng = np.random.default_rng(seed)
    obs = scenes(1, seed=seed)[0]
    prefix = vla.encode(obs)
    state = vla.start(prefix)
    out = vla.forward(state)                       # prefill
    first = int(vla.actions.argmax_token(out.last_logits))
    vla.commit(state, out, [], first)
    tree = random_tree(vla, rng)
    check_paths(vla, prefix, [first], tree, vla.forward(state, tree))


def test_tree_in_the_prefill_forward(vla):
    rng = np.random.default_rng(5)
    prefix = vla.encode(scenes(1, seed=5)[0])
    tree = random_tree(vla, rng, n=10, max_depth=7)
    state = vla.start(prefix)
    check_paths(vla, prefix, [], tree, vla.forward(state, tree))


def assert_cache_equals_fresh_prefill(vla, state, prefix, tokens):
    fresh = DynamicCache(config=vla.language_model.config)
    with torch.no_grad():
        vla.language_model.model(inputs_embeds=torch.cat([prefix.embeds, vla.embed(tokens)], 1),
                                 past_key_values=fresh, use_cache=True)
    assert len(state.cache.layers) == len(fresh.layers) == TINY.num_layers
    for ours, theirs in zip(state.cache.layers, fresh.layers, strict=True):
        assert ours.keys.shape == theirs.keys.shape
        torch.testing.assert_close(ours.keys, theirs.keys, atol=ATOL, rtol=1e-5)
        torch.testing.assert_close(ours.values, theirs.values, atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
def test_commit_equals_fresh_prefill_over_several_rounds(vla, seed):
    rng = np.random.default_rng(seed)
    prefix = vla.encode(scenes(1, seed=10 + seed)[0])
    state = vla.start(prefix)
    committed: list[int] = []
    for round_ in range(3):
        tree = random_tree(vla, rng, n=8, max_depth=3) if round_ else DraftTree.empty()
        out = vla.forward(state, tree)
        path = tree.path_to(int(rng.integers(len(tree)))) if len(tree) else []
        bonus = int(vla.actions.token_of_bin(int(rng.integers(256))))
        vla.commit(state, out, path, bonus)
        # The cache holds prompt + every committed token except the pending bonus.
        accepted = [int(tree.tokens[i]) for i in path]
        assert_cache_equals_fresh_prefill(vla, state, prefix, committed + accepted)
        committed += accepted + [bonus]
        assert state.action_tokens == committed
        assert state.committed_length == prefix.embeds.shape[1] + len(committed)
        torch.testing.assert_close(state.pending_embeds, vla.embed([bonus]))


def test_target_bins_come_from_the_parents_output(tiny_random_vla):
    vla = tiny_random_vla
    prefix = vla.encode(scenes(1, seed=3)[0])
    state = vla.start(prefix)
    tree = random_tree(vla, np.random.default_rng(3), n=9)
    out = vla.forward(state, tree)
    bins = vla.target_bins(out)
    for i, p in enumerate(tree.parents):
        logits = out.last_logits if p < 0 else out.tree_logits[p]
        assert bins[i] == int(vla.actions.argmax_bin(logits))


def test_misuse_is_refused(tiny_random_vla):
    vla = tiny_random_vla
    prefix = vla.encode(scenes(1, seed=4)[0])
    state = vla.start(prefix)
    tree = DraftTree.chain(vla.actions.token_of_bin(np.array([1, 2, 3])))
    out = vla.forward(state, tree)
    with pytest.raises(RuntimeError, match="commit"):
        vla.forward(state, tree)
    with pytest.raises(ValueError, match="path"):
        vla.commit(state, out, [1, 2], 300)
    vla.commit(state, out, [0], 300)
    with pytest.raises(RuntimeError, match="commit"):
        vla.commit(state, out, [0], 300)                 # twice
    with pytest.raises(ValueError, match="tree.tokens"):
        vla.forward(state, DraftTree.chain([10_000]))


def test_flash_attention_is_refused():
    net = SmallVLA.random(TINY, seed=0).net
    net.llm.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="attn_implementation"):
        SmallVLA(net)
