"""Sequence-wise group tree from K retrieved actions (HeiSD component 3).

Tree: the 7 action tokens split into kinematic groups, position (dims 0-2), rotation (3-5)
and gripper (6) (``retrieval_groups``). A tree node is a whole group taken from one
candidate; a path is a position group, then a rotation group, then a gripper token, each
possibly from a different candidate (the gripper is one token, so it is never mixed).
Identical groups are merged, and group nodes that start with the same bins share those token
nodes (a token trie). Each candidate's own path goes in first (rank order), then
cross-candidate combinations by priority, until the node budget (tokens) is spent.

Flattened to the project-wide token-tree contract: ``tokens`` (N,) vocabulary ids and
``parents`` (N,) (-1 = child of the last committed position), topologically ordered
(parent < child, DFS pre-order, siblings in priority order). Bin b has token id
``vocab_base - 1 - b`` (OpenVLA: vocab_base = 32000).

The relaxed acceptance of such trees lives in ``retrieval_accept``, the action groups in
``retrieval_groups``. Pure numpy.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from heisd_ros.data.observation import ACTION_DIM
from heisd_ros.decoding.retrieval_groups import GROUPS, NUM_BINS


@dataclass(frozen=True)
class GroupTreeConfig:
    """Shape of the group tree.

    Attributes:
        node_budget: most tokens (tree nodes) in the tree; one candidate needs up to 7.
        max_candidates: candidates used, best first (extra ones are ignored).
        combine: add cross-candidate combinations after the candidates' own paths.
    """

    node_budget: int = 64
    max_candidates: int = 8
    combine: bool = True

    def __post_init__(self) -> None:
        if self.node_budget < ACTION_DIM:
            raise ValueError(f"node_budget: expected >= {ACTION_DIM} (one full action), "
                             f"got {self.node_budget}")
        if self.max_candidates < 1:
            raise ValueError(f"max_candidates: expected >= 1, got {self.max_candidates}")


@dataclass(frozen=True, eq=False)
class GroupTree:
    """A flattened group tree: token-level arrays (N,) plus the group nodes over them.

    Group nodes that start alike share their leading token nodes (same context, same target
    output), so ``groups`` may overlap in their first tokens but never end on the same node.
    """

    tokens: np.ndarray  # (N,) int64 vocabulary ids
    parents: np.ndarray  # (N,) int64, -1 = child of the last committed position
    bins: np.ndarray  # (N,) int64 draft bins
    dims: np.ndarray  # (N,) int64 action dimension (0..6) each node fills
    group_kind: np.ndarray  # (N,) int64 index into GROUPS
    groups: tuple[tuple[int, ...], ...]  # group nodes: their token nodes, in DFS order
    candidate_paths: tuple[tuple[int, ...], ...]  # per candidate: its token nodes (() = cut)
    start_dim: int = 0

    def __len__(self) -> int:
        return len(self.tokens)

    def to_draft_tree(self):
        """The project-wide ``DraftTree`` (no log-probs: retrieval has none)."""
        from heisd_ros.models.draft_tree import DraftTree  # numpy-only module

        return DraftTree(self.tokens, self.parents, None, source="retrieval")


def _combination_paths(cand: list[list[int]], kinds: list[int], dims_of: dict) -> list[list]:
    """Cross-candidate group combinations, best-ranked candidates first."""
    contents = [[tuple(row[d] for d in dims_of[k]) for k in kinds] for row in cand]
    levels = range(len(kinds))
    # Each distinct group content, with the best rank of a candidate that carries it.
    rank = [{} for _ in levels]
    for i, path in enumerate(contents):
        for level in levels:
            rank[level].setdefault(path[level], i)
    paths = [list(p) for p in itertools.product(*[list(r) for r in rank])]
    paths.sort(key=lambda p: (max(rank[lv][c] for lv, c in enumerate(p)),
                              sum(rank[lv][c] for lv, c in enumerate(p)),
                              [rank[lv][c] for lv, c in enumerate(p)]))
    return paths


def build_group_tree(candidate_bins: np.ndarray, vocab_base: int,
                     config: GroupTreeConfig | None = None, start_dim: int = 0) -> GroupTree:
    """Group tree of K candidates' bins (K, 7), best-ranked first.

    ``start_dim`` > 0 drafts only dims start_dim..6 (earlier ones already committed); the
    group containing start_dim is then shortened to its remaining dims.
    """
    cfg = config or GroupTreeConfig()
    cand = np.asarray(candidate_bins)
    if cand.ndim != 2 or cand.shape[1] != ACTION_DIM or len(cand) == 0:
        raise ValueError(f"candidate_bins: expected shape (K>=1, {ACTION_DIM}), got {cand.shape}")
    if cand.min() < 0 or cand.max() >= NUM_BINS:
        raise ValueError(f"candidate_bins: expected bins 0..{NUM_BINS - 1}")
    if not 0 <= start_dim < ACTION_DIM:
        raise ValueError(f"start_dim: expected 0..{ACTION_DIM - 1}, got {start_dim}")
    if vocab_base < NUM_BINS:
        raise ValueError(f"vocab_base: expected >= {NUM_BINS}, got {vocab_base}")
    cand = cand[:cfg.max_candidates].astype(np.int64).tolist()  # plain ints from here on
    kinds = [k for k, dims in enumerate(GROUPS) if dims[-1] >= start_dim]
    dims_of = {k: tuple(d for d in GROUPS[k] if d >= start_dim) for k in kinds}

    # Token trie; a path of group contents is inserted whole or not at all (budget).
    tok_bin: list[int] = []
    children: list[list[int]] = []
    roots: list[int] = []
    index: dict[tuple[int, int], int] = {}  # (parent token, bin) -> token

    def insert(path: list[tuple[int, ...]]) -> list[int] | None:
        flat = [b for content in path for b in content]
        parent, depth = -1, 0
        while depth < len(flat) and (parent, flat[depth]) in index:  # shared prefix
            parent = index[(parent, flat[depth])]
            depth += 1
        if len(tok_bin) + len(flat) - depth > cfg.node_budget:
            return None
        parent, out = -1, []
        for b in flat:
            node = index.get((parent, b))
            if node is None:
                node = len(tok_bin)
                tok_bin.append(b)
                children.append([])
                index[(parent, b)] = node
                (roots if parent == -1 else children[parent]).append(node)
            out.append(node)
            parent = node
        return out

    own = [insert([tuple(row[d] for d in dims_of[k]) for k in kinds]) for row in cand]
    if cfg.combine and len(cand) > 1:
        for path in _combination_paths(cand, kinds, dims_of):
            if len(tok_bin) >= cfg.node_budget:
                break
            insert(path)
    return _flatten(tok_bin, children, roots, own, kinds, dims_of, vocab_base, start_dim)


def _flatten(tok_bin, children, roots, own, kinds, dims_of, vocab_base, start_dim) -> GroupTree:
    order: list[int] = []  # trie token -> position in DFS pre-order
    parent_of = {}
    stack = [(t, -1) for t in reversed(roots)]
    while stack:  # DFS pre-order: parent < child, siblings in insertion (priority) order
        t, parent = stack.pop()
        parent_of[t] = parent
        order.append(t)
        stack.extend((c, t) for c in reversed(children[t]))
    new = {t: i for i, t in enumerate(order)}
    parents = np.asarray([new[parent_of[t]] if parent_of[t] >= 0 else -1 for t in order],
                         dtype=np.int64)
    bins = np.asarray([tok_bin[t] for t in order], dtype=np.int64)
    depth = np.zeros(len(order), dtype=np.int64)
    for i, p in enumerate(parents):
        depth[i] = depth[p] + 1 if p >= 0 else 0
    dims = start_dim + depth
    kind_of_dim = {d: k for k in kinds for d in dims_of[k]}
    group_kind = np.asarray([kind_of_dim[d] for d in dims], dtype=np.int64)
    # A group node ends on a token at its kind's last dim; walk up for its tokens.
    groups = []
    for i in range(len(order)):
        kind = group_kind[i]
        if dims[i] != dims_of[kind][-1]:
            continue
        chain = [i]
        for _ in range(len(dims_of[kind]) - 1):
            chain.append(int(parents[chain[-1]]))
        groups.append(tuple(reversed(chain)))
    paths = tuple(tuple(new[t] for t in p) if p else () for p in own)
    return GroupTree(vocab_base - 1 - bins, parents, bins, dims, group_kind, tuple(groups),
                     paths, start_dim)
