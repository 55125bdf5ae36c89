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
:func:`completion_at_deadline` is the hybrid decoder's use of it.
"""

from __future__ import annotations

import numpy as np

from heisd_ros.data.observation import ACTION_DIM
from heisd_ros.decoding.unverified import RULE_DEADLINE, unverified_problem


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


def completion_at_deadline(actions, codec, checker, config, episode, trail, notes: list[str]):
    """``heisd_deadline``: what completes an action still incomplete at the budget.

    Returns ``complete(state, last)`` for the verifier: the rest of the action's tokens, or
    None to keep verifying. The rest is the target's own prediction along the drafted branch
    nearest its tokens (:func:`predicted_tail`, from the last forward ``last``; no further
    forward), under the bounds of any unverified action (gripper kept, per-command limits,
    the run bound of ``config``, an ``UnverifiedConfig``); ``checker`` (a ``BehindChecker``)
    then verifies it behind from the step's own decode ``state``. ``actions`` maps tokens
    and bins, ``codec`` decodes bins; ``trail`` is the episode's unverified run so far;
    ``notes`` gets the reason of each decision.
    """

    def complete(state, last) -> list[int] | None:
        first = len(state.action_tokens)
        verified = np.asarray(actions.bin_of_token(np.asarray(state.action_tokens, np.int64)),
                              np.int64)
        rest = predicted_tail(last.tree.parents, actions.bin_of_token(last.tree.tokens),
                              last.target_bins, last.path, int(verified[-1]), ACTION_DIM - first)
        if rest is None:
            notes.append(f"verify ({RULE_DEADLINE}): the draft tree ends before position "
                         f"{ACTION_DIM - 1}")
            return None
        bins = np.concatenate([verified, np.asarray(rest, np.int64)])
        problem = unverified_problem(codec.decode(bins), episode, trail.run,
                                     config.behind_max_run, config)
        if problem:
            notes.append(f"verify ({RULE_DEADLINE}): {problem}")
            return None
        checker.start_from(state, bins, episode.step_index if episode else -1, RULE_DEADLINE)
        notes.append(f"completed at the deadline ({RULE_DEADLINE}, run {trail.run + 1}): "
                     f"{first} token(s) verified, {ACTION_DIM - first} predicted along the "
                     f"draft, checked behind")
        return [int(t) for t in actions.token_of_bin(np.asarray(rest, np.int64))]

    return complete
