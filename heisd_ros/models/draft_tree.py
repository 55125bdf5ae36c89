"""The token tree every draft source proposes and the target verifies in one forward.

Contract (shared by the drafter, retrieval and hybrid decoders):
- ``tokens`` (N,) vocabulary ids; ``parents`` (N,) ints, -1 = child of the last committed
  position; nodes are topologically ordered (``parents[i] < i``).
- Node i sits at sequence position ``committed_length + depth(i)`` (roots: depth 0).
- ``log_probs`` (N,) is optional (a retrieval source has none): the draft's cumulative
  log-probability of the path ending at each node.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DraftTree:
    """A topologically ordered token tree (see the module docstring for the contract)."""

    tokens: np.ndarray
    parents: np.ndarray
    log_probs: np.ndarray | None = None
    source: str = ""

    def __post_init__(self) -> None:
        tokens = _as_int_array("tokens", self.tokens)
        parents = _as_int_array("parents", self.parents)
        if tokens.shape != parents.shape:
            raise ValueError(f"parents: shape {parents.shape} differs from tokens {tokens.shape}")
        index = np.arange(len(parents))
        bad = np.nonzero((parents < -1) | (parents >= index))[0]
        if bad.size:
            raise ValueError(f"parents: node {int(bad[0])} has parent {int(parents[bad[0]])}; "
                             "expected -1 or an earlier node (topological order)")
        if self.log_probs is not None:
            lp = np.asarray(self.log_probs, dtype=np.float64).reshape(-1)
            if lp.shape != tokens.shape:
                raise ValueError(f"log_probs: shape {lp.shape} differs from tokens {tokens.shape}")
            object.__setattr__(self, "log_probs", lp)
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "parents", parents)

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def empty(cls, source: str = "") -> DraftTree:
        """A tree without nodes (the round becomes a plain AR step)."""
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int64), source=source)

    @classmethod
    def chain(cls, tokens, source: str = "") -> DraftTree:
        """A single path: token i is the child of token i - 1."""
        toks = _as_int_array("tokens", tokens)
        return cls(toks, np.arange(len(toks)) - 1, source=source)

    def depths(self) -> np.ndarray:
        """Depth of each node (roots 0), (N,) int64."""
        depth = np.zeros(len(self), dtype=np.int64)
        for i, p in enumerate(self.parents):
            depth[i] = 0 if p < 0 else depth[p] + 1
        return depth

    def ancestor_matrix(self) -> np.ndarray:
        """(N, N) bool: ``m[i, j]`` is True when j is i or an ancestor of i (tree attention)."""
        n = len(self)
        m = np.zeros((n, n), dtype=bool)
        for i, p in enumerate(self.parents):
            if p >= 0:
                m[i] = m[p]
            m[i, i] = True
        return m

    def path_to(self, node: int) -> list[int]:
        """Node indices from a root down to ``node`` (inclusive)."""
        path = []
        while node >= 0:
            path.append(int(node))
            node = int(self.parents[node])
        return path[::-1]

    def is_path(self, nodes: list[int]) -> bool:
        """True when ``nodes`` is a root-to-node chain of this tree (empty counts)."""
        return not nodes or self.path_to(nodes[-1]) == list(nodes)

    def limit_depth(self, max_depth: int) -> DraftTree:
        """The sub-tree of nodes with depth < ``max_depth`` (topological order kept)."""
        keep = np.nonzero(self.depths() < max_depth)[0]
        if len(keep) == len(self):
            return self
        # Ancestors of kept nodes are kept too (smaller depth), so parents only need renumbering.
        new_index = np.full(len(self), -1, dtype=np.int64)
        new_index[keep] = np.arange(len(keep))
        parents = np.where(self.parents[keep] < 0, -1, new_index[self.parents[keep]])
        log_probs = None if self.log_probs is None else self.log_probs[keep]
        return DraftTree(self.tokens[keep], parents, log_probs, self.source)


def _as_int_array(name: str, value) -> np.ndarray:
    if hasattr(value, "detach"):  # torch tensor: the contract allows LongTensor or array
        value = value.detach().cpu().numpy()
    arr = np.asarray(value)
    if arr.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D sequence, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name}: expected integers, got dtype {arr.dtype}")
    return arr.astype(np.int64)
