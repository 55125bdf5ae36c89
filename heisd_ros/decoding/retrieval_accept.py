"""Relaxed sequence-wise acceptance of group trees (HeiSD component 3).

Acceptance: depth-first over group nodes; a group passes when its summed |draft - target| bin
deviation is <= 30 and every token's is <= 15 (configurable), the gripper only on an exact
match. ``target_bins_at_node[n]`` is the target's argmax bin at the position node n occupies
(the verifier reads it from the output at n's parent). :func:`accepted_group_path` and
:class:`GroupRule` apply the same rule to any token tree (e.g. the drafter's). Pure numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from heisd_ros.data.observation import ACTION_DIM
from heisd_ros.decoding.retrieval_groups import GRIPPER_GROUP, GROUPS, NUM_BINS

if TYPE_CHECKING:
    from heisd_ros.decoding.retrieval_tree import GroupTree


@dataclass(frozen=True)
class GroupAcceptConfig:
    """Relaxed group acceptance (paper: sum <= 30, per token <= 15, gripper exact).

    Zero tolerances give exact matching (lossless verification of the same tree).
    """

    group_sum_max_bins: int = 30
    token_max_bins: int = 15
    gripper_exact: bool = True

    def __post_init__(self) -> None:
        for name in ("group_sum_max_bins", "token_max_bins"):
            value = getattr(self, name)
            if not 0 <= value < NUM_BINS:
                raise ValueError(f"{name}: expected 0..{NUM_BINS - 1} bins, got {value}")


@dataclass(frozen=True, eq=False)
class TreeAcceptance:
    """Result of verifying a group tree.

    Attributes:
        accepted_nodes: token nodes of the accepted root-to-node path, in order (commit
            ``tree.tokens[accepted_nodes]``; the target's output at the last one, or at the
            last committed position when empty, gives the bonus token).
        first_error_position: action dimension (0..6) of the first draft token not accepted,
            -1 when the draft reached the end of the action.
        accepted_groups: number of whole groups accepted.
    """

    accepted_nodes: np.ndarray
    first_error_position: int
    accepted_groups: int

    @property
    def accepted_length(self) -> int:
        """Draft tokens accepted (the bonus token not included)."""
        return len(self.accepted_nodes)


_KIND_OF_DIM = np.array([next(k for k, g in enumerate(GROUPS) if d in g)
                         for d in range(ACTION_DIM)])
_LAST_DIM_OF_KIND = np.array([g[-1] for g in GROUPS])


def _passes(kind: int, dev_sum: int, dev_max: int, cfg: GroupAcceptConfig) -> bool:
    if kind == GRIPPER_GROUP and cfg.gripper_exact:
        return dev_max == 0  # a gripper state change must never be relaxed
    return dev_sum <= cfg.group_sum_max_bins and dev_max <= cfg.token_max_bins


def accepted_group_path(parents: np.ndarray, draft_bins: np.ndarray, target_bins: np.ndarray,
                        dims: np.ndarray, config: GroupAcceptConfig | None = None) -> list[int]:
    """Group rule on any token tree: the longest root-to-node path of accepted whole groups.

    A group is the run of consecutive nodes on a path whose dims fall in one of ``GROUPS``;
    it passes on its summed/max bin deviation (gripper: exact). A path may end only where a
    group ends, or at a leaf (a tree that stops mid-group is judged on what it drafted).
    Draft bin -1 marks a non-action token, never accepted. Ties go to the lower node index
    (DFS pre-order of a group tree = the higher-ranked candidate). All inputs (N,) ints.
    """
    cfg = config or GroupAcceptConfig()
    parents, dims = np.asarray(parents, np.int64), np.asarray(dims, np.int64)
    draft, target = np.asarray(draft_bins, np.int64), np.asarray(target_bins, np.int64)
    n = len(parents)
    kind = _KIND_OF_DIM[dims] if n else dims
    dev = np.where(draft >= 0, np.abs(draft - target), NUM_BINS)  # non-action: never passes
    seg_sum, seg_max = np.zeros(n, np.int64), np.zeros(n, np.int64)
    prefix_ok, ok = np.zeros(n, bool), np.zeros(n, bool)
    for i in range(n):  # topological order: a parent is final before its children
        p = parents[i]
        if p >= 0 and kind[p] == kind[i]:  # the parent's group continues
            seg_sum[i] = seg_sum[p] + dev[i]
            seg_max[i] = max(seg_max[p], dev[i])
            prefix_ok[i] = prefix_ok[p]
        else:  # a new group starts: every group above must have been accepted
            seg_sum[i] = seg_max[i] = dev[i]
            prefix_ok[i] = p < 0 or ok[p]
        ok[i] = prefix_ok[i] and _passes(int(kind[i]), int(seg_sum[i]), int(seg_max[i]), cfg)
    has_child = np.zeros(n, bool)
    has_child[parents[parents >= 0]] = True
    ends = ok & ((dims == _LAST_DIM_OF_KIND[kind]) | ~has_child) if n else ok
    if not ends.any():
        return []
    depth = np.zeros(n, np.int64)
    for i in range(n):
        depth[i] = depth[parents[i]] + 1 if parents[i] >= 0 else 0
    best = int(np.flatnonzero(ends)[np.argmax(depth[ends])])  # argmax: first = lowest index
    path = []
    while best >= 0:
        path.append(best)
        best = int(parents[best])
    return path[::-1]


@dataclass(frozen=True)
class GroupRule:
    """The group rule as an acceptance rule on a verify view, for any token tree.

    The view needs ``parents``, ``draft_bins``, ``target_bins`` and ``dims`` (see
    ``acceptance.VerifyView``).
    """

    config: GroupAcceptConfig = GroupAcceptConfig()

    def __call__(self, view) -> list[int]:
        """Accepted node indices along one root-to-node path."""
        return accepted_group_path(view.parents, view.draft_bins, view.target_bins, view.dims,
                                   self.config)


def _check_target(tree: GroupTree, target_bins_at_node: np.ndarray) -> np.ndarray:
    target = np.asarray(target_bins_at_node, dtype=np.int64)
    if target.shape != tree.tokens.shape:
        raise ValueError(f"target_bins_at_node: expected shape {tree.tokens.shape}, "
                         f"got {target.shape}")
    if target.size and (target.min() < 0 or target.max() >= NUM_BINS):
        raise ValueError(f"target_bins_at_node: expected bins 0..{NUM_BINS - 1}")
    return target


def accept_group_tree(tree: GroupTree, target_bins_at_node: np.ndarray,
                      config: GroupAcceptConfig | None = None) -> TreeAcceptance:
    """Longest accepted group path (ties: the earlier, i.e. higher-ranked, branch)."""
    target = _check_target(tree, target_bins_at_node)
    nodes = np.asarray(accepted_group_path(tree.parents, tree.bins, target, tree.dims, config),
                       dtype=np.int64)
    end = tree.start_dim + len(nodes)
    kinds = tree.group_kind[nodes]
    groups = int(np.count_nonzero(np.diff(kinds, prepend=-1))) if len(nodes) else 0
    return TreeAcceptance(nodes, -1 if end >= ACTION_DIM else end, groups)


@dataclass(frozen=True, eq=False)
class TokenView:
    """Per-token verification view for reporting (all (N,))."""

    deviation_bins: np.ndarray  # |draft bin - target bin|
    token_ok: np.ndarray  # within the per-token bound (gripper: exact, if so configured)
    exact: np.ndarray  # draft bin == target bin (what strict verification would accept)
    group_ok: np.ndarray  # the token's group passes on its own (ancestors not considered)


def token_view(tree: GroupTree, target_bins_at_node: np.ndarray,
               config: GroupAcceptConfig | None = None) -> TokenView:
    """Per-token deviations and verdicts for reporting (acceptance itself is per group)."""
    cfg = config or GroupAcceptConfig()
    target = _check_target(tree, target_bins_at_node)
    dev = np.abs(tree.bins - target)
    gripper = (tree.group_kind == GRIPPER_GROUP) & cfg.gripper_exact
    token_ok = np.where(gripper, dev == 0, dev <= cfg.token_max_bins)
    group_ok = np.zeros(len(tree), dtype=bool)
    for nodes in tree.groups:  # shared leading tokens: ok if any group through them passes
        idx = list(nodes)
        group_ok[idx] |= _passes(int(tree.group_kind[idx[0]]), int(dev[idx].sum()),
                                 int(dev[idx].max()), cfg)
    return TokenView(dev, token_ok, dev == 0, group_ok)
