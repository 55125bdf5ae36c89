"""Sequence-wise group tree: structure, budget, and relaxed group acceptance."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from heisd_ros.decoding.retrieval_accept import (
    GroupAcceptConfig,
    GroupRule,
    accept_group_tree,
    accepted_group_path,
    token_view,
)
from heisd_ros.decoding.retrieval_groups import GROUPS, bins_from_tokens
from heisd_ros.decoding.retrieval_tree import GroupTreeConfig, build_group_tree

VOCAB = 32000
RELAXED = GroupAcceptConfig()


def _kind(dim: int) -> int:
    return next(k for k, dims in enumerate(GROUPS) if dim in dims)


def _passes(draft, target, dims, cfg=RELAXED) -> bool:
    dev = np.abs(np.asarray(draft) - np.asarray(target))
    if _kind(dims[0]) == 2 and cfg.gripper_exact:
        return not dev.any()
    return dev.sum() <= cfg.group_sum_max_bins and dev.max() <= cfg.token_max_bins


def _root_to_leaf_paths(tree):
    kids = {i: [] for i in range(-1, len(tree))}
    for i, p in enumerate(tree.parents):
        kids[int(p)].append(i)
    out, stack = [], [[c] for c in kids[-1]]
    while stack:
        path = stack.pop()
        if not kids[path[-1]]:
            out.append(path)
        stack.extend(path + [c] for c in kids[path[-1]])
    return out


def _accepted_prefix(tree, path, target, cfg=RELAXED) -> int:
    """Reference: tokens accepted along one path, group by group."""
    n, i = 0, 0
    while i < len(path):
        kind = tree.group_kind[path[i]]
        size = sum(1 for t in path[i:] if tree.group_kind[t] == kind)
        nodes = path[i:i + size]
        if not _passes(tree.bins[nodes], target[nodes], tree.dims[nodes].tolist(), cfg):
            break
        n, i = n + size, i + size
    return n


# Candidates drawn near a common action so groups repeat and combine.
candidates_st = st.integers(1, 6).flatmap(lambda k: hnp.arrays(
    np.int64, (k, 7), elements=st.integers(100, 112)))


@settings(max_examples=80, deadline=None)
@given(cand=candidates_st, budget=st.integers(7, 90), start_dim=st.sampled_from([0, 0, 1, 3, 6]),
       seed=st.integers(0, 2**31))
def test_structure_and_acceptance_invariants(cand, budget, start_dim, seed):
    tree = build_group_tree(cand, VOCAB, GroupTreeConfig(node_budget=budget),
                            start_dim=start_dim)
    n = len(tree)
    assert 0 < n <= budget
    np.testing.assert_array_equal(bins_from_tokens(tree.tokens, VOCAB), tree.bins)
    for i, p in enumerate(tree.parents):
        assert p < i  # topological order
        assert tree.dims[i] == (start_dim if p < 0 else tree.dims[p] + 1)
    siblings = {(int(p), int(b)) for p, b in zip(tree.parents, tree.bins, strict=True)}
    assert len(siblings) == n  # no duplicated node under one parent
    assert tree.candidate_paths[0]  # the best candidate always fits (budget >= 7)
    # Targets at every node: around the first candidate, sometimes far off.
    rng = np.random.default_rng(seed)
    target = np.clip(cand[0][tree.dims] + rng.integers(-20, 21, size=n), 0, 255)
    target[rng.random(n) < 0.2] = rng.integers(0, 256)
    result = accept_group_tree(tree, target)
    nodes = result.accepted_nodes.tolist()
    # One root-to-node path ...
    assert all(tree.parents[b] == a for a, b in zip([-1] + nodes, nodes, strict=False))
    # ... of whole groups, each within its bounds; the gripper never deviates.
    for g in tree.groups:
        if set(g) <= set(nodes) and g[-1] in nodes:
            assert _passes(tree.bins[list(g)], target[list(g)], tree.dims[list(g)].tolist())
    if 6 in tree.dims[nodes]:
        j = nodes[tree.dims[nodes].tolist().index(6)]
        assert tree.bins[j] == target[j]
    # ... and the longest one the tree holds.
    best = max(_accepted_prefix(tree, p, target) for p in _root_to_leaf_paths(tree))
    assert result.accepted_length == best
    end = start_dim + best
    assert result.first_error_position == (-1 if end == 7 else end)


@settings(max_examples=60, deadline=None)
@given(cand=candidates_st, pick=st.integers(0, 5))
def test_each_candidate_path_present_and_target_equal_candidate_fully_accepted(cand, pick):
    k = len(cand)
    tree = build_group_tree(cand, VOCAB, GroupTreeConfig(node_budget=7 * k))
    for row, path in zip(cand, tree.candidate_paths, strict=True):
        assert len(path) == 7
        np.testing.assert_array_equal(tree.bins[list(path)], row)
        assert all(tree.parents[b] == a for a, b in zip([-1, *path], path, strict=False))
    truth = cand[pick % k]
    target = truth[tree.dims]  # the target emits `truth` whatever it was fed
    result = accept_group_tree(tree, target, GroupAcceptConfig(0, 0))  # even exact matching
    assert result.accepted_length == 7 and result.first_error_position == -1
    np.testing.assert_array_equal(tree.bins[result.accepted_nodes], truth)


def test_groups_combine_across_candidates():
    cand = np.array([[10, 20, 30, 200, 200, 200, 0],
                     [90, 90, 90, 40, 50, 60, 0]])
    truth = np.array([10, 20, 30, 40, 50, 60, 0])  # position of #0, rotation of #1
    tree = build_group_tree(cand, VOCAB)
    result = accept_group_tree(tree, truth[tree.dims])
    assert result.accepted_length == 7 and result.accepted_groups == 3
    np.testing.assert_array_equal(tree.bins[result.accepted_nodes], truth)
    own_only = build_group_tree(cand, VOCAB, GroupTreeConfig(combine=False))
    assert accept_group_tree(own_only, truth[own_only.dims]).accepted_length == 3


def test_relaxed_bounds_and_gripper_rule():
    draft = np.array([[100, 100, 100, 100, 100, 100, 255]])
    tree = build_group_tree(draft, VOCAB)
    at = lambda action: np.asarray(action)[tree.dims]  # noqa: E731
    # Sum 30, each <= 15: both groups accepted; gripper exact.
    ok = accept_group_tree(tree, at([110, 90, 110, 115, 85, 100, 255]))
    assert ok.accepted_length == 7
    # One token off by 16 (sum 16) breaks the position group: nothing accepted.
    assert accept_group_tree(tree, at([116, 100, 100, 100, 100, 100, 255])).accepted_length == 0
    # Sum 31 with every token <= 15 breaks the rotation group.
    r = accept_group_tree(tree, at([100, 100, 100, 111, 110, 110, 255]))
    assert r.accepted_length == 3 and r.first_error_position == 3
    # The gripper must match exactly, even by one bin.
    g = accept_group_tree(tree, at([100, 100, 100, 100, 100, 100, 254]))
    assert g.accepted_length == 6 and g.first_error_position == 6
    view = token_view(tree, at([100, 100, 100, 100, 100, 100, 254]))
    assert view.token_ok.tolist() == [True] * 6 + [False]
    assert view.deviation_bins.tolist() == [0] * 6 + [1]
    loose = GroupAcceptConfig(gripper_exact=False)
    assert accept_group_tree(tree, at([100] * 6 + [254]), loose).accepted_length == 7


def test_ties_go_to_the_higher_ranked_candidate():
    truth = np.array([50, 50, 50, 50, 50, 50, 1])
    cand = np.array([truth + [3, 0, 0, 0, 0, 0, 0], truth])  # both fully acceptable
    tree = build_group_tree(cand, VOCAB)
    result = accept_group_tree(tree, truth[tree.dims])
    assert tree.bins[result.accepted_nodes].tolist() == cand[0].tolist()


def test_budget_keeps_best_candidates_first():
    cand = np.arange(4 * 7).reshape(4, 7) * 7 % 256
    tree = build_group_tree(cand, VOCAB, GroupTreeConfig(node_budget=15))
    assert [len(p) for p in tree.candidate_paths] == [7, 7, 0, 0]
    assert len(tree) <= 15


@pytest.mark.parametrize("kwargs, field", [
    (dict(node_budget=6), "node_budget"), (dict(max_candidates=0), "max_candidates")])
def test_tree_config_errors(kwargs, field):
    with pytest.raises(ValueError, match=field):
        GroupTreeConfig(**kwargs)


def test_bad_inputs():
    with pytest.raises(ValueError, match="group_sum_max_bins"):
        GroupAcceptConfig(group_sum_max_bins=-1)
    with pytest.raises(ValueError, match="candidate_bins"):
        build_group_tree(np.zeros((2, 6), int), VOCAB)
    with pytest.raises(ValueError, match="candidate_bins"):
        build_group_tree(np.full((1, 7), 256), VOCAB)
    tree = build_group_tree(np.zeros((1, 7), int), VOCAB)
    with pytest.raises(ValueError, match="target_bins_at_node"):
        accept_group_tree(tree, np.zeros(3, int))


def test_group_rule_on_a_verify_view_and_draft_tree_contract():
    from heisd_ros.decoding.acceptance import VerifyView

    cand = np.array([[10, 20, 30, 40, 50, 60, 1], [12, 20, 30, 40, 50, 60, 0]])
    tree = build_group_tree(cand, VOCAB)
    draft_tree = tree.to_draft_tree()
    np.testing.assert_array_equal(draft_tree.tokens, tree.tokens)
    np.testing.assert_array_equal(draft_tree.parents, tree.parents)
    assert draft_tree.log_probs is None
    target = cand[1][tree.dims]
    view = VerifyView(tree.parents, tree.bins, target, tree.dims)
    assert GroupRule()(view) == accept_group_tree(tree, target).accepted_nodes.tolist()
    assert tree.bins[GroupRule()(view)].tolist() == [10, 20, 30, 40, 50, 60, 0]


def test_group_rule_on_a_generic_chain():
    # A drafter chain that stops inside the rotation group is judged on what it drafted.
    parents, dims = np.arange(5) - 1, np.arange(5)
    target = np.array([100, 100, 100, 100, 100])
    assert accepted_group_path(parents, [101, 99, 100, 110, 100], target, dims) == [0, 1, 2, 3, 4]
    # A non-action token (-1) is never accepted, and takes its whole group with it.
    assert accepted_group_path(parents, [101, 99, 100, 100, -1], target, dims) == [0, 1, 2]
    # Within a continuing group, a node may not end the path: a failed tail rejects it all.
    assert accepted_group_path(parents, [100, 100, 100, 100, 140], target, dims) == [0, 1, 2]
    assert accepted_group_path(np.zeros(0, int), [], [], np.zeros(0, int)) == []
