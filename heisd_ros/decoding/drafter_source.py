"""Drafter SD: the EAGLE-2 dynamic draft tree from a one-layer draft head.

Per call: one head forward over the (hidden, next-embedding) pairs the target produced since
the last call (the whole prompt at the start of an action) gives the root distribution; then
each tree level feeds the ``top_k`` best frontier nodes (by cumulative log-probability) with a
tree mask, and each expands into its ``top_k`` best children. All generated nodes are re-ranked
by cumulative log-probability and the best ``node_budget`` kept (EAGLE-2, Li et al. 2024). Only
action ids are drafted. Draft positions mirror the target's: the pair (h_t, e_{t+1}) sits at t.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from heisd_ros.decoding.draft_source import DraftContext, DraftSource
from heisd_ros.models.draft_head import DraftHead, DraftKV
from heisd_ros.models.draft_tree import DraftTree
from heisd_ros.models.target import TargetVLA


@dataclass(frozen=True)
class DraftTreeConfig:
    """Shape of the dynamic tree.

    Attributes:
        top_k: children expanded per node and frontier width per level.
        max_depth: deepest level (an action has 7 tokens and the first comes from the prefill).
        node_budget: nodes kept after re-ranking (tokens the target verifies per round).
    """

    top_k: int = 4
    max_depth: int = 6
    node_budget: int = 16

    def __post_init__(self) -> None:
        if not isinstance(self.top_k, int) or not 1 <= self.top_k <= 64:
            raise ValueError(f"top_k: expected an int in 1..64, got {self.top_k!r}")
        if not isinstance(self.max_depth, int) or not 1 <= self.max_depth <= 6:
            raise ValueError(f"max_depth: expected an int in 1..6, got {self.max_depth!r}")
        if not isinstance(self.node_budget, int) or self.node_budget < 1:
            raise ValueError(f"node_budget: expected a positive int, got {self.node_budget!r}")


class DrafterSource(DraftSource):
    """EAGLE-2 draft source (see the module docstring)."""

    name = "drafter"

    def __init__(self, head: DraftHead, target: TargetVLA, config: DraftTreeConfig | None = None):
        self.head = head.eval()
        self.target = target
        self.config = config or DraftTreeConfig()
        lm_weight = target.language_model.get_output_embeddings().weight
        # The target's lm_head rows of the 256 action ids, ascending id order.
        self._action_rows = lm_weight[target.actions.first_id:target.actions.vocab_base].detach()
        self._kv = DraftKV()
        self._cached = 0
        self._action_id: int | None = None
        self._forwards = 0

    @property
    def forwards(self) -> int:
        """Draft-head forwards of the last :meth:`propose` (catch-up + one per tree level)."""
        return self._forwards

    def _log_probs(self, features: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax((features @ self._action_rows.T).float(), dim=-1)

    @torch.no_grad()
    def propose(self, context: DraftContext) -> DraftTree | None:
        """Catch up on the new target hidden states, then grow the dynamic tree."""
        self._forwards = 0
        if context.first_call or context.action_id != self._action_id:
            self._kv, self._cached, self._action_id = DraftKV(), 0, context.action_id
        if context.hidden is None:
            return None
        self._kv.crop(self._cached)             # drop the previous call's tree entries
        seen = context.hidden.shape[1]
        if seen != context.committed_length - 1 or seen <= self._cached:
            raise ValueError(f"context: {seen} hidden states for committed length "
                             f"{context.committed_length}; the draft cache holds {self._cached}")
        # Catch up on the (h_t, e_{t+1}) pairs forwarded since this source last read.
        hidden = context.hidden[:, self._cached:]
        next_embeds = context.next_embeds[:, self._cached:]
        n_new = hidden.shape[1]
        device, dtype = hidden.device, hidden.dtype
        positions = torch.arange(self._cached, seen, device=device)[None]
        mask = _mask(self._cached, torch.ones(n_new, n_new, dtype=torch.bool).tril(), dtype, device)
        features = self.head(hidden, next_embeds, positions, mask, self._kv)
        self._cached += n_new
        self._forwards = 1
        return self._grow(features[0, -1], min(self.config.max_depth, context.max_depth),
                          device, dtype)

    def _grow(self, root_feature: torch.Tensor, depth: int, device, dtype) -> DraftTree:
        k, first_id = self.config.top_k, self.target.actions.first_id
        scores, ids = self._log_probs(root_feature).topk(k)
        tokens, parents = (ids + first_id).tolist(), [-1] * k
        cum = scores.tolist()
        frontier = list(range(k))                # node indices expanded next
        feature_of = {i: root_feature for i in frontier}   # feature predicting each node
        fed: list[int] = []                      # nodes fed to the head, in kv order
        for _ in range(1, depth):
            # Feed the frontier: pair (feature predicting node, embedding of node's token).
            hidden = torch.stack([feature_of[i] for i in frontier])[None]
            embeds = self.target.embed([tokens[i] for i in frontier])
            level = len(fed) and _depth(parents, fed[-1]) + 1
            positions = torch.full((1, len(frontier)), self._cached + level, device=device)
            fed_index = {node: j for j, node in enumerate(fed)}
            allowed = torch.zeros(len(frontier), len(fed) + len(frontier), dtype=torch.bool)
            for row, node in enumerate(frontier):
                allowed[row, len(fed) + row] = True
                parent = parents[node]
                while parent >= 0:
                    allowed[row, fed_index[parent]] = True
                    parent = parents[parent]
            mask = _mask(self._cached, allowed, dtype, device)
            out = self.head(hidden, embeds, positions, mask, self._kv)[0]
            self._forwards += 1
            fed.extend(frontier)
            child_lp, child_ids = self._log_probs(out).topk(k)   # (F, k)
            parent_cum = torch.tensor([cum[i] for i in frontier], device=child_lp.device)
            child_cum = (parent_cum[:, None] + child_lp).tolist()
            child_ids = child_ids.tolist()
            new_nodes = []
            for row, node in enumerate(frontier):
                for j in range(k):
                    new_nodes.append(len(tokens))
                    tokens.append(child_ids[row][j] + first_id)
                    parents.append(node)
                    cum.append(child_cum[row][j])
                    feature_of[len(tokens) - 1] = out[row]
            frontier = sorted(new_nodes, key=lambda i: -cum[i])[:k]
        return _rerank(tokens, parents, cum, self.config.node_budget)


def _depth(parents: list[int], node: int) -> int:
    d = 0
    while parents[node] >= 0:
        node, d = parents[node], d + 1
    return d


def _mask(n_cached: int, allowed: torch.Tensor, dtype, device) -> torch.Tensor:
    """Additive (1, 1, q, n_cached + kv_new) mask: the committed draft cache is always visible."""
    q = allowed.shape[0]
    full = torch.cat([torch.ones(q, n_cached, dtype=torch.bool), allowed], dim=1).to(device)
    mask = torch.zeros(full.shape, dtype=dtype, device=device)
    return mask.masked_fill_(~full, torch.finfo(dtype).min)[None, None]


def _rerank(tokens: list[int], parents: list[int], cum: list[float], budget: int) -> DraftTree:
    """Keep the ``budget`` best nodes by cumulative log-prob, topologically ordered.

    A child never outranks its parent (its score is lower or equal and ties go to the
    shallower node), so the kept set is a tree.
    """
    depth = [_depth(parents, i) for i in range(len(tokens))]
    order = sorted(range(len(tokens)), key=lambda i: (-cum[i], depth[i], i))[:budget]
    kept = sorted(order, key=lambda i: (depth[i], i))      # topological: parents first
    new_index = {old: new for new, old in enumerate(kept)}
    new_parents = [-1 if parents[i] < 0 else new_index[parents[i]] for i in kept]
    return DraftTree(np.array([tokens[i] for i in kept], dtype=np.int64),
                     np.array(new_parents, dtype=np.int64),
                     log_probs=np.array([cum[i] for i in kept]), source="drafter")
