"""Draft trees and acceptance rules: contracts and properties (no model needed)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heisd_ros.decoding.acceptance import (
    RelaxedRule,
    VerifyView,
    exact_rule,
    first_rejected_dim,
    longest_accepted_path,
)
from heisd_ros.models.draft_tree import DraftTree


@st.composite
def trees_with_bins(draw, max_nodes=24):
    """A random topological tree (depth <= 7 - first_dim) with draft and target bins."""
    n = draw(st.integers(1, max_nodes))
    first_dim = draw(st.integers(0, 6))
    parents, depth = [], []
    for i in range(n):
        choices = [-1] + [j for j in range(i) if depth[j] + first_dim < 6]
        p = draw(st.sampled_from(choices))
        parents.append(p)
        depth.append(0 if p < 0 else depth[p] + 1)
    draft = draw(st.lists(st.integers(-1, 255), min_size=n, max_size=n))
    target = draw(st.lists(st.integers(0, 255), min_size=n, max_size=n))
    # Some drafts equal or near the target so that acceptance actually happens.
    near = draw(st.lists(st.integers(-3, 3), min_size=n, max_size=n))
    use_near = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    draft = [int(np.clip(t + d, 0, 255)) if u else b
             for b, t, d, u in zip(draft, target, near, use_near, strict=True)]
    return VerifyView(parents=np.array(parents), draft_bins=np.array(draft),
                      target_bins=np.array(target), dims=first_dim + np.array(depth))


def brute_force_deepest(view, ok):
    """Depth+1 of the deepest node whose whole root path is ok (0 if none)."""
    tree = DraftTree(np.zeros(len(view.parents), np.int64), view.parents)
    best = 0
    for i in range(len(view.parents)):
        if all(ok[j] for j in tree.path_to(i)):
            best = max(best, len(tree.path_to(i)))
    return best


@settings(max_examples=300, deadline=None)
@given(trees_with_bins(), st.lists(st.integers(0, 20), min_size=6, max_size=6))
def test_relaxed_rule_stays_in_bounds_and_never_moves_the_gripper(view, radius):
    rule = RelaxedRule(tuple(radius) + (0,))
    path = rule(view)
    tree = DraftTree(np.zeros(len(view.parents), np.int64), view.parents)
    assert tree.is_path(path)
    r = np.array(rule.radius_bins)
    for node in path:
        assert view.draft_bins[node] >= 0
        assert abs(view.draft_bins[node] - view.target_bins[node]) <= r[view.dims[node]]
        if view.dims[node] == 6:
            assert view.draft_bins[node] == view.target_bins[node]
    ok = (view.draft_bins >= 0) & (np.abs(view.draft_bins - view.target_bins) <= r[view.dims])
    assert len(path) == brute_force_deepest(view, ok)   # the longest acceptable path


@settings(max_examples=200, deadline=None)
@given(trees_with_bins())
def test_exact_rule_accepts_only_the_targets_tokens(view):
    path = exact_rule(view)
    assert all(view.draft_bins[i] == view.target_bins[i] for i in path)
    assert len(path) == brute_force_deepest(view, view.draft_bins == view.target_bins)
    # Radius 0 everywhere is the exact rule.
    assert len(RelaxedRule((0,) * 7)(view)) == len(path)


def test_relaxed_prefers_the_closer_of_two_equally_long_paths():
    view = VerifyView(parents=np.array([-1, -1]), draft_bins=np.array([10, 12]),
                      target_bins=np.array([13, 13]), dims=np.array([0, 0]))
    assert RelaxedRule((5,) * 6 + (0,))(view) == [1]


def test_first_rejected_dim():
    view = VerifyView(parents=np.array([-1, 0, 1, -1]), draft_bins=np.array([5, 6, 7, 1]),
                      target_bins=np.array([5, 6, 9, 2]), dims=np.array([2, 3, 4, 2]))
    path = exact_rule(view)
    assert path == [0, 1]
    assert first_rejected_dim(view, path) == 4         # node 2 (dim 4) was rejected
    assert first_rejected_dim(view, [0, 1, 2]) == -1   # a leaf: nothing offered, nothing rejected


def test_longest_path_with_nothing_acceptable_is_empty():
    assert longest_accepted_path(np.array([-1, 0]), np.array([False, True])) == []


def test_tree_contract_validation():
    with pytest.raises(ValueError, match="parents"):
        DraftTree(np.array([1, 2]), np.array([-1, 1]))      # a node is its own parent
    with pytest.raises(ValueError, match="parents"):
        DraftTree(np.array([1, 2]), np.array([1, -1]))      # parent after child
    with pytest.raises(ValueError, match="parents"):
        DraftTree(np.array([1, 2]), np.array([-1]))
    with pytest.raises(ValueError, match="tokens"):
        DraftTree(np.array([1.5]), np.array([-1]))
    with pytest.raises(ValueError, match="log_probs"):
        DraftTree(np.array([1]), np.array([-1]), log_probs=np.zeros(2))


def test_tree_helpers():
    tree = DraftTree(np.array([7, 8, 9, 10, 11]), np.array([-1, 0, -1, 1, 2]))
    assert tree.depths().tolist() == [0, 1, 0, 2, 1]
    assert tree.path_to(3) == [0, 1, 3]
    m = tree.ancestor_matrix()
    for i in range(len(tree)):
        assert set(np.nonzero(m[i])[0]) == set(tree.path_to(i))
    limited = tree.limit_depth(2)
    assert limited.tokens.tolist() == [7, 8, 9, 11]
    assert limited.parents.tolist() == [-1, 0, -1, 2]
    assert DraftTree.chain([4, 5, 6]).parents.tolist() == [-1, 0, 1]
    assert tree.is_path([0, 1, 3]) and not tree.is_path([1, 3]) and tree.is_path([])
