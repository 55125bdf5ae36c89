"""Acceptance rules: which root-to-node path of a verified draft tree is accepted.

Every rule is a small pure function of a :class:`VerifyView` returning the accepted node
indices along one root-to-node path (possibly empty). The decoder commits that path and
appends the target's bonus token. Rules here:
- :func:`exact_rule` (lossless): a node is acceptable when its bin equals the target's argmax
  bin at its position.
- :class:`RelaxedRule` (Spec-VLA token-level relaxation): ``|draft bin - target bin| <= r[dim]``
  with a per-dimension r; the gripper defaults to r = 0.
The sequence-wise group rule lives in ``retrieval_tree.py`` and takes the same view.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from heisd_ros.data.observation import ACTION_DIM


@dataclass(frozen=True)
class VerifyView:
    """What a rule sees of one verified tree, all (N,) int64 arrays.

    Attributes:
        parents: tree parents (-1 = root level).
        draft_bins: bin of each node's token, -1 for a non-action token (never acceptable).
        target_bins: the target's argmax bin at each node's position (from the parent's output;
            roots use the last committed position's output).
        dims: action dimension (0..6) of each node's position.
    """

    parents: np.ndarray
    draft_bins: np.ndarray
    target_bins: np.ndarray
    dims: np.ndarray


AcceptanceRule = Callable[[VerifyView], list]


def longest_accepted_path(parents: np.ndarray, node_ok: np.ndarray,
                          cost: np.ndarray | None = None) -> list[int]:
    """The deepest node all of whose ancestors (and itself) are ok, as a root-to-node path.

    Ties between equally deep nodes go to the smaller summed ``cost`` along the path, then to
    the lower node index (a drafter orders nodes by score, so this prefers its best guess).
    """
    n = len(parents)
    depth = np.full(n, -1, dtype=np.int64)   # -1 = not on an accepted chain
    total = np.zeros(n, dtype=np.float64)
    cost = np.zeros(n) if cost is None else np.asarray(cost, dtype=np.float64)
    best = -1
    for i in range(n):
        p = parents[i]
        if not node_ok[i] or (p >= 0 and depth[p] < 0):
            continue
        depth[i] = 0 if p < 0 else depth[p] + 1
        total[i] = cost[i] + (0.0 if p < 0 else total[p])
        deeper = best < 0 or depth[i] > depth[best]
        if deeper or (depth[i] == depth[best] and total[i] < total[best]):
            best = i
    path = []
    while best >= 0:
        path.append(int(best))
        best = int(parents[best])
    return path[::-1]


def exact_rule(view: VerifyView) -> list[int]:
    """Lossless: accept only tokens equal to the target's greedy token."""
    ok = (view.draft_bins >= 0) & (view.draft_bins == view.target_bins)
    return longest_accepted_path(view.parents, ok)


@dataclass(frozen=True)
class RelaxedRule:
    """Spec-VLA relaxed acceptance with a per-dimension radius in bins.

    Attributes:
        radius_bins: (7,) max |draft bin - target bin| per action dimension; the gripper
            (last) should stay 0 so a draft can never change the gripper state.
    """

    radius_bins: tuple[int, ...] = field(default=(9, 9, 9, 9, 9, 9, 0))

    def __post_init__(self) -> None:
        r = tuple(int(x) for x in self.radius_bins)
        if len(r) != ACTION_DIM or min(r) < 0 or max(r) > 255:
            raise ValueError(f"radius_bins: expected {ACTION_DIM} ints in 0..255, "
                             f"got {self.radius_bins}")
        object.__setattr__(self, "radius_bins", r)

    def __call__(self, view: VerifyView) -> list[int]:
        """Accept the longest path whose every token is within its dimension's radius."""
        deviation = np.abs(view.draft_bins - view.target_bins)
        radius = np.asarray(self.radius_bins, dtype=np.int64)[view.dims]
        ok = (view.draft_bins >= 0) & (deviation <= radius)
        # Among equally long paths prefer the one closest to the target.
        return longest_accepted_path(view.parents, ok, cost=deviation)


def first_rejected_dim(view: VerifyView, accepted: list[int]) -> int:
    """Action dimension at which a draft token was rejected in this round, -1 if none was.

    A rejection happened when the tree offered a child of the accepted path's end (or a root,
    if nothing was accepted) and none of them was taken.
    """
    end = accepted[-1] if accepted else -1
    offered = np.nonzero(view.parents == end)[0]
    return int(view.dims[offered[0]]) if offered.size else -1
