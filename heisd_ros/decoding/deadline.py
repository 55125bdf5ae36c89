"""Completing an action at the deadline (``heisd_deadline``) from what the prefill computed.

A verified step with a retrieval draft verifies the draft tree in its first target forward.
When the sequence-wise rule refuses a group, the target has committed the accepted tokens
plus its own token at the first refused position, and a second forward would be needed for
the rest: at the ``openvla-7b-paper`` profile that forward makes the step miss its control
period. But the first forward already computed the target's greedy bin at every node of the
tree, each conditioned on that node's drafted ancestors. :func:`predicted_tail` reads the
rest of the action from there: below the accepted path, it follows the drafted child nearest
the target's own token, and at each further position takes the target's prediction there,
then descends into the drafted child nearest that prediction. The target's predictions are
conditioned on drafted tokens a few bins from the ones executed, so they are not verified;
the check behind (``heisd_ros.decoding.behind``) verifies them from the step's own cache.
Pure numpy.
"""

from __future__ import annotations

import numpy as np


def predicted_tail(parents, draft_bins, target_bins, path, bonus_bin: int,
                   needed: int) -> list[int] | None:
    """The target's predicted bins for the ``needed`` positions after the bonus, or None.

    Args:
        parents: (N,) the round's tree (parent index per node, -1 for a root).
        draft_bins: (N,) each node's drafted bin.
        target_bins: (N,) the target's greedy bin at each node's position.
        path: the accepted nodes, root first (empty: none accepted).
        bonus_bin: the target's own bin at the position after the path.
        needed: positions still to fill after the bonus.

    Returns:
        ``needed`` bins, or None when the tree does not reach that deep below the path.
    """
    parents = np.asarray(parents, dtype=np.int64)
    draft = np.asarray(draft_bins, dtype=np.int64)
    target = np.asarray(target_bins, dtype=np.int64)
    end = int(path[-1]) if len(path) else -1

    def nearest_child(node: int, bin_: int) -> int | None:
        children = np.flatnonzero(parents == node)
        if not children.size:
            return None
        return int(children[np.argmin(np.abs(draft[children] - bin_))])  # ties: lower index

    node = nearest_child(end, int(bonus_bin))   # the drafted token where the bonus stands
    tail: list[int] = []
    while len(tail) < needed and node is not None:
        children = np.flatnonzero(parents == node)
        if not children.size:
            return None
        predicted = int(target[children[0]])    # siblings share their ancestors' prediction
        tail.append(predicted)
        node = nearest_child(node, predicted)
    return tail if len(tail) == needed else None
