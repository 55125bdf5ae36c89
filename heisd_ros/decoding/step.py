"""One speculative round: verify a draft tree in one target forward, accept, commit, bonus.

With an empty tree the round is a plain AR step (the first round is the prefill), so AR,
drafter SD and retrieval SD share this function.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from heisd_ros.decoding.acceptance import AcceptanceRule, VerifyView, first_rejected_dim
from heisd_ros.models.draft_tree import DraftTree
from heisd_ros.models.target import DecodeState, TargetVLA


@dataclass(frozen=True)
class RoundResult:
    """What one round committed.

    Attributes:
        tree: the verified tree (depth-limited to the tokens still needed).
        path: accepted node indices (root to node).
        tokens: committed action ids: the path's tokens, then the bonus token if one was needed.
        bonus_token: the target's token after the path, None when the action was complete.
        target_bins: (N,) target argmax bin at each node's position.
        first_rejected_dim: action position of a rejected draft token, -1 if none.
        predicting_hidden: (len(tokens), H) hidden state whose lm_head output predicted each token.
        new_hidden: (1, k, H) hidden states of the positions this round added to the cache.
        next_embeds: (1, k, H) input embeddings of the position after each of them.
    """

    tree: DraftTree
    path: list[int]
    tokens: list[int]
    bonus_token: int | None
    target_bins: np.ndarray
    first_rejected_dim: int
    predicting_hidden: torch.Tensor
    new_hidden: torch.Tensor
    next_embeds: torch.Tensor


def speculative_step(target: TargetVLA, state: DecodeState, tree: DraftTree | None,
                     rule: AcceptanceRule, n_action_tokens: int = 7) -> RoundResult:
    """Verify ``tree`` after the committed sequence in one forward and commit the result."""
    first_dim = len(state.action_tokens)      # action position of the tree's roots
    needed = n_action_tokens - first_dim
    if needed <= 0:
        raise ValueError(f"state: the action already has {first_dim} tokens")
    tree = (tree if tree is not None else DraftTree.empty()).limit_depth(needed)
    out = target.forward(state, tree)
    target_bins = target.target_bins(out, first_dim, state.gripper_closed)
    view = VerifyView(parents=tree.parents, draft_bins=target.actions.bin_of_token(tree.tokens),
                      target_bins=target_bins, dims=first_dim + tree.depths())
    path = list(rule(view)) if len(tree) else []
    if not tree.is_path(path) or any(view.draft_bins[i] < 0 for i in path):
        raise ValueError(f"rule returned {path}, not a path of action tokens of the tree")
    # Bonus: the target's own token after the accepted path (EAGLE), unless complete.
    last = path[-1] if path else -1
    after_hidden = out.context_hidden[-1] if last < 0 else out.tree_hidden[last]
    bonus = None
    if len(path) < needed:
        after_logits = out.last_logits if last < 0 else out.tree_logits[last]
        bonus = target.greedy_token(after_logits, first_dim + len(path),
                                    state.gripper_closed)
    predicting = [out.hidden_before(i) for i in path]
    if bonus is not None:
        predicting.append(after_hidden)
    path_tokens = [int(tree.tokens[i]) for i in path]
    new_hidden = torch.cat([out.context_hidden, out.tree_hidden[path]])[None]
    following = path_tokens + ([bonus] if bonus is not None else [])
    next_embeds = torch.cat([out.context_embeds[:, 1:], target.embed(following)], dim=1)
    target.commit(state, out, path, bonus)
    return RoundResult(tree=tree, path=path, tokens=following, bonus_token=bonus,
                       target_bins=target_bins,
                       first_rejected_dim=first_rejected_dim(view, path) if len(tree) else -1,
                       predicting_hidden=torch.stack(predicting),
                       new_hidden=new_hidden, next_embeds=next_embeds)
