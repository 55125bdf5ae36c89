"""Sequence-wise group tree from K retrieved actions, and its relaxed acceptance (HeiSD comp. 3).

Tree: the 7 action tokens split into kinematic groups, position (dims 0-2), rotation (3-5)
and gripper (6). A tree node is a whole group taken from one candidate; a path is a position
group, then a rotation group, then a gripper token, each possibly from a different candidate
(the gripper is one token, so it is never mixed). Identical groups are merged, and group
nodes that start with the same bins share those token nodes (a token trie). Each
candidate's own path goes in first (rank order), then cross-candidate combinations by
priority, until the node budget (tokens) is spent.

Flattened to the project-wide token-tree contract: ``tokens`` (N,) vocabulary ids and
``parents`` (N,) (-1 = child of the last committed position), topologically ordered
(parent < child, DFS pre-order, siblings in priority order). Bin b has token id
``vocab_base - 1 - b`` (OpenVLA: vocab_base = 32000).

Acceptance: depth-first over group nodes; a group passes when its summed |draft - target| bin
deviation is <= 30 and every token's is <= 15 (configurable), the gripper only on an exact
match. ``target_bins_at_node[n]`` is the target's argmax bin at the position node n occupies
(the verifier reads it from the output at n's parent). Pure numpy.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

GROUPS: tuple[tuple[int, ...], ...] = ((0, 1, 2), (3, 4, 5), (6,))
GROUP_NAMES: tuple[str, ...] = ("position", "rotation", "gripper")
GRIPPER_GROUP = 2
ACTION_DIM = 7
NUM_BINS = 256


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
        from heisd_ros.decoding.tree import DraftTree  # numpy-only module

        return DraftTree(self.tokens, self.parents, None, source="retrieval")


def tokens_from_bins(bins: np.ndarray, vocab_base: int) -> np.ndarray:
    """Vocabulary ids of action bins (OpenVLA: the last 256 ids, reversed)."""
    return vocab_base - 1 - np.asarray(bins, dtype=np.int64)


def bins_from_tokens(tokens: np.ndarray, vocab_base: int) -> np.ndarray:
    """Action bins of vocabulary ids (inverse of :func:`tokens_from_bins`)."""
    return vocab_base - 1 - np.asarray(tokens, dtype=np.int64)


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
