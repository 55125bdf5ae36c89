"""The target-VLA interface: encode, prefill, verify a token tree, commit the accepted path.

A target wraps a Hugging Face causal LM (``.model`` decoder + ``.lm_head``, e.g.
``LlamaForCausalLM``) and adds its own :meth:`TargetVLA.encode` (vision + prompt -> input
embeddings). Everything after the prefix is shared: the decoders never see the model.

Sequence bookkeeping (one :class:`DecodeState` per action):
- ``cached_length`` positions have keys/values in the cache;
- ``pending_embeds`` (1, C, H) are committed positions not forwarded yet (the prompt before
  the prefill, the bonus token afterwards); ``committed_length = cached_length + C``;
- a forward runs the pending positions causally and then an optional draft tree whose node i
  sits at ``committed_length + depth(i)`` and attends to the whole context plus its ancestors.
  A tree can thus ride along in the prefill forward (a fully accepted retrieval draft then
  costs one target forward).

Prompt-head reuse: a prompt whose first positions depend only on the instruction
(``Prefix.static_length``; the small VLA's ``instruction_first`` layout) has their keys and
values computed once per instruction and copied into each new decode, which then starts with
them cached and only the per-step positions (vision, proprio) pending. The first forward still
reports hidden states for the whole prompt, so draft heads see what they would see without
reuse. The reuse is keyed on the parameters' storage and version counters as well, so a
model that is trained or re-loaded in place recomputes it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import DynamicCache

from heisd_ros.actions.bins import ActionTokenMap, bins_to_values
from heisd_ros.actions.normalization import ActionCodec
from heisd_ros.data.observation import ACTION_DIM, Observation
from heisd_ros.models.draft_tree import DraftTree

#: Attention implementations that honour a custom 4D additive mask (tree attention).
MASK_CAPABLE_ATTENTION = ("eager", "sdpa")


@dataclass(frozen=True)
class Prefix:
    """A prompt ready for the prefill.

    Attributes:
        embeds: (1, P, H) input embeddings (vision tokens, proprio, instruction).
        vision_features: (n_cameras, D) pooled patch features of each camera (primary first),
            float32 on the CPU; the retrieval DB embeds these.
        static_length: the first positions of ``embeds`` that depend only on ``static_key``
            (e.g. bos + the instruction), whose keys/values :meth:`TargetVLA.start` computes
            once and reuses; 0 = none (every position is run at every step).
        static_key: what those positions depend on (hashable, e.g. the instruction's ids).
    """

    embeds: torch.Tensor
    vision_features: torch.Tensor
    static_length: int = 0
    static_key: Hashable | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.static_length < self.embeds.shape[1]:
            raise ValueError(f"static_length: expected 0 <= n < {self.embeds.shape[1]} (the "
                             f"prompt length), got {self.static_length}")
        if self.static_length and self.static_key is None:
            raise ValueError("static_key: a reusable prompt head needs a key")


@dataclass
class DecodeState:
    """KV cache and the committed-but-not-forwarded positions of one decode (see module doc)."""

    cache: DynamicCache
    pending_embeds: torch.Tensor
    prefix_length: int
    cached_length: int = 0
    action_tokens: list[int] = field(default_factory=list)
    uncommitted_tree: int = 0   # tree nodes appended to the cache by the last forward
    gripper_closed: bool | None = None  # the gripper's current state, for the gripper rule
    #: (hidden states, input embeddings), each (1, S, H), of a reused prompt head: cached but
    #: not yet reported; the first forward reports them with its context (see module doc).
    head: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def committed_length(self) -> int:
        """Prompt + committed action tokens (cached or pending)."""
        return self.cached_length + self.pending_embeds.shape[1]


@dataclass(frozen=True)
class ForwardOutput:
    """Result of one target forward over the pending positions plus a tree.

    Attributes:
        tree: the verified tree (empty for a plain AR / prefill forward).
        context_hidden: (C, H) last-layer hidden states (lm_head input) of the pending positions
            (preceded, in the first forward of a decode that reuses a prompt head, by the
            head's positions).
        context_embeds: (1, C, H) input embeddings of the same positions.
        last_logits: (V,) logits at the last pending position: the target's distribution for
            the root-level tokens.
        tree_hidden: (N, H) hidden states at the tree nodes.
        tree_logits: (N, V) logits at the tree nodes (distribution of each node's children).
    """

    tree: DraftTree
    context_hidden: torch.Tensor
    context_embeds: torch.Tensor
    last_logits: torch.Tensor
    tree_hidden: torch.Tensor
    tree_logits: torch.Tensor

    def logits_before(self, node: int) -> torch.Tensor:
        """(V,) logits that predict ``node``'s position (parent's output; roots: context's)."""
        parent = int(self.tree.parents[node]) if node >= 0 else -1
        return self.last_logits if parent < 0 else self.tree_logits[parent]

    def hidden_before(self, node: int) -> torch.Tensor:
        """(H,) hidden state whose lm_head output predicts ``node``'s position."""
        parent = int(self.tree.parents[node]) if node >= 0 else -1
        return self.context_hidden[-1] if parent < 0 else self.tree_hidden[parent]


class TargetVLA(ABC):
    """The verifier: a causal LM behind an observation encoder (see the module docstring)."""

    def __init__(self, language_model, actions: ActionTokenMap):
        attn = getattr(language_model.config, "_attn_implementation", None)
        if attn not in MASK_CAPABLE_ATTENTION:
            raise ValueError(f"attn_implementation: tree verification needs one of "
                             f"{MASK_CAPABLE_ATTENTION} (a 4D custom mask), got {attn!r}")
        vocab = language_model.get_output_embeddings().weight.shape[0]
        if vocab < actions.vocab_base:
            raise ValueError(f"vocab_base: {actions.vocab_base} exceeds the model's "
                             f"{vocab} output rows")
        self.language_model = language_model
        self.actions = actions
        self._heads: OrderedDict[Hashable, _CachedHead] = OrderedDict()

    #: How many prompt heads (instructions) :meth:`start` keeps keys/values of.
    prompt_head_capacity: int = 8

    #: Set by a subclass or loader that knows its codec (e.g. OpenVLA's dataset statistics).
    _codec: ActionCodec | None = None

    #: The gripper decision rule (see :meth:`greedy_bins`): None = plain greedy; p in (0, 1)
    #: = change the gripper's state when the other state's total probability reaches p.
    #: A checkpoint may carry it.
    gripper_switch_probability: float | None = None

    @property
    def codec(self) -> ActionCodec:
        """Bins <-> physical actions with the statistics this model was trained on.

        An explicitly set codec wins; else ``action_stats`` (q01/q99 stored with a trained
        checkpoint); else the default statistics (a random initialisation).
        """
        if self._codec is not None:
            return self._codec
        stats = getattr(self, "action_stats", None)
        return ActionCodec(stats) if stats is not None else ActionCodec()

    @codec.setter
    def codec(self, value: ActionCodec) -> None:
        self._codec = value

    @abstractmethod
    def encode(self, observation: Observation) -> Prefix:
        """Vision + prompt -> the prefix embeddings and pooled vision features."""

    @property
    def device(self) -> torch.device:
        """Device of the language model."""
        return self.language_model.device

    @property
    def hidden_size(self) -> int:
        """Width H of the last-layer hidden states."""
        return self.language_model.config.hidden_size

    def embed(self, token_ids) -> torch.Tensor:
        """(n,) ids -> (1, n, H) input embeddings."""
        ids = torch.as_tensor(np.asarray(token_ids, dtype=np.int64), device=self.device)
        return self.language_model.get_input_embeddings()(ids.reshape(1, -1))

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) last-layer hidden states -> (..., V) logits."""
        return self.language_model.get_output_embeddings()(hidden)

    def start(self, prefix: Prefix, gripper_closed: bool | None = None) -> DecodeState:
        """A fresh decode whose pending positions are the prompt.

        With ``prefix.static_length`` = S the first S positions start cached (computed on
        the first use of ``prefix.static_key`` and reused after); else nothing is cached.
        ``gripper_closed``: the gripper's current state (the last command), which the
        gripper rule needs (:meth:`greedy_bins`); None = unknown.
        """
        n_static = prefix.static_length
        cache, unreported = DynamicCache(config=self.language_model.config), None
        if n_static:
            head = self._prompt_head(prefix)
            for i, (keys, values) in enumerate(head.kv):
                cache.update(keys, values, i)   # commit() replaces, never mutates, these tensors
            unreported = (head.hidden, head.embeds)
        return DecodeState(cache=cache, pending_embeds=prefix.embeds[:, n_static:],
                           prefix_length=prefix.embeds.shape[1], cached_length=n_static,
                           gripper_closed=gripper_closed, head=unreported)

    @torch.no_grad()
    def _prompt_head(self, prefix: Prefix) -> _CachedHead:
        """Keys/values and hidden states of ``prefix``'s static head, computed once per key."""
        embeds = prefix.embeds[:, :prefix.static_length]
        stamp = self._weights_stamp()
        head = self._heads.get(prefix.static_key)
        if head is None or head.stamp != stamp or not torch.equal(head.embeds, embeds):
            cache = DynamicCache(config=self.language_model.config)
            out = self.language_model.model(inputs_embeds=embeds, past_key_values=cache,
                                            use_cache=True)
            head = _CachedHead(stamp=stamp, embeds=embeds.detach().clone(),
                               hidden=out.last_hidden_state.detach(),
                               kv=tuple((layer.keys, layer.values) for layer in cache.layers))
            self._heads[prefix.static_key] = head
            while len(self._heads) > self.prompt_head_capacity:
                self._heads.popitem(last=False)
        self._heads.move_to_end(prefix.static_key)
        return head

    def _weights_stamp(self) -> tuple:
        """Identifies the language model's current weights: storage and in-place version."""
        return tuple((p.data_ptr(), p._version) for p in self.language_model.parameters())

    @torch.no_grad()
    def forward(self, state: DecodeState, tree: DraftTree | None = None) -> ForwardOutput:
        """One target forward: the pending positions, then ``tree`` (may be None / empty)."""
        if state.uncommitted_tree:
            raise RuntimeError("forward: commit the previous forward's tree first")
        tree = tree if tree is not None else DraftTree.empty()
        n_ctx, n_tree = state.pending_embeds.shape[1], len(tree)
        if n_ctx == 0:
            raise ValueError("forward: nothing pending; commit a next token first")
        n_rows = self.language_model.get_input_embeddings().weight.shape[0]
        if n_tree and (tree.tokens.min() < 0 or tree.tokens.max() >= n_rows):
            raise ValueError(f"tree.tokens: ids must lie in 0..{n_rows - 1}, got "
                             f"{tree.tokens.min()}..{tree.tokens.max()}")
        x = torch.cat([state.pending_embeds, self.embed(tree.tokens)], dim=1)
        past = state.cached_length
        depths = torch.as_tensor(tree.depths(), device=self.device)
        positions = torch.cat([torch.arange(past, past + n_ctx, device=self.device),
                               past + n_ctx + depths]).unsqueeze(0)
        mask = tree_attention_mask(past, n_ctx, tree, x.dtype, self.device)
        out = self.language_model.model(inputs_embeds=x, attention_mask=mask,
                                        position_ids=positions, past_key_values=state.cache,
                                        use_cache=True)
        hidden = out.last_hidden_state[0]
        # lm_head only where a next-token distribution is needed: last pending + tree nodes.
        logits = self.lm_head(hidden[n_ctx - 1:])
        state.uncommitted_tree = n_tree
        context_hidden, context_embeds = hidden[:n_ctx], state.pending_embeds
        if state.head is not None:
            head_hidden, head_embeds = state.head
            context_hidden = torch.cat([head_hidden[0], context_hidden])
            context_embeds = torch.cat([head_embeds, context_embeds], dim=1)
            state.head = None
        return ForwardOutput(tree=tree, context_hidden=context_hidden,
                             context_embeds=context_embeds, last_logits=logits[0],
                             tree_hidden=hidden[n_ctx:], tree_logits=logits[1:])

    def target_bins(self, out: ForwardOutput, first_dim: int = 0,
                    gripper_closed: bool | None = None) -> np.ndarray:
        """The target's greedy bin at each tree node's position, (N,) int64.

        Node i's bin comes from its parent's output (roots: the last pending position's); the
        sequence-wise rule consumes this as ``target_bins_at_node``. ``first_dim`` is the
        action dimension of the roots (node i fills ``first_dim + depth(i)``);
        ``gripper_closed`` is the gripper's current state (see :meth:`greedy_bins`).
        """
        parents = torch.as_tensor(out.tree.parents, device=out.last_logits.device)
        all_logits = torch.cat([out.last_logits[None], out.tree_logits])  # row 0 = context
        return self.greedy_bins(all_logits[parents + 1], first_dim + out.tree.depths(),
                                gripper_closed)

    def greedy_token(self, logits: torch.Tensor, dim: int,
                     gripper_closed: bool | None = None) -> int:
        """The target's token for action dimension ``dim`` from one row of logits (V,)."""
        bins = self.greedy_bins(logits[None], [dim], gripper_closed)
        return int(self.actions.token_of_bin(int(bins[0])))

    def greedy_bins(self, logits: torch.Tensor, dims,
                    gripper_closed: bool | None = None) -> np.ndarray:
        """The target's choice of bin for each row of ``logits`` (N, V) filling ``dims`` (N,).

        Greedy over the action ids, except that with ``gripper_switch_probability`` = p set
        and the gripper's current state known (``gripper_closed``), the gripper dimension is
        decided as the binary variable it is: the gripper changes state when the other
        state's total probability (softmax over the action ids) reaches p, and the most
        likely bin of the chosen state is taken. Plain argmax can deadlock a closed loop: at
        the grasp pose a model that gives closing 0.45 keeps the gripper open forever, since
        the next observation is the same (and likewise above a drop-off point). With the
        state unknown the choice is plain greedy. Lossless decoding reproduces AR under
        either rule.
        """
        bins = self.actions.argmax_bin(logits).cpu().numpy()
        threshold = self.gripper_switch_probability
        rows = np.flatnonzero(np.asarray(dims) == ACTION_DIM - 1)
        if threshold is None or gripper_closed is None or not len(rows):
            return bins
        action_logits = self.actions.action_logits(logits[torch.as_tensor(rows)]).float()
        # Action logits are in id order: id first_id + j is bin n_bins - 1 - j.
        closing = torch.as_tensor(self._closing_bins()[::-1].copy(), device=logits.device)
        other = ~closing if gripper_closed else closing
        p_other = torch.softmax(action_logits, dim=-1)[:, other].sum(dim=-1)
        side = torch.where((p_other >= threshold)[:, None], other[None], ~other[None])
        best = action_logits.masked_fill(~side, float("-inf")).argmax(dim=-1)
        bins[rows] = (self.actions.n_bins - 1 - best).cpu().numpy()
        return bins

    def _closing_bins(self) -> np.ndarray:
        """(n_bins,) bool in bin order: the gripper bins this model's codec decodes to closed."""
        threshold = self.codec.stats.gripper_threshold
        return bins_to_values(np.arange(self.actions.n_bins)) > threshold

    def commit(self, state: DecodeState, out: ForwardOutput, path: list[int],
               next_token: int | None) -> None:
        """Keep the pending positions and the accepted ``path`` in the cache.

        The other tree nodes are dropped and ``next_token`` (the bonus token, None at the end)
        becomes pending.
        """
        if not out.tree.is_path(list(path)):
            raise ValueError(f"path: {path} is not a root-to-node path of the tree")
        base = state.committed_length
        if state.cache.get_seq_length() != base + len(out.tree):
            raise RuntimeError("commit: call it once, right after forward(state, tree)")
        keep = torch.as_tensor([base + i for i in path], dtype=torch.long, device=self.device)
        for layer in state.cache.layers:
            tail = layer.keys.index_select(2, keep), layer.values.index_select(2, keep)
            layer.keys = torch.cat([layer.keys[:, :, :base], tail[0]], dim=2)
            layer.values = torch.cat([layer.values[:, :, :base], tail[1]], dim=2)
        state.cached_length = base + len(path)
        state.uncommitted_tree = 0
        state.action_tokens.extend(int(out.tree.tokens[i]) for i in path)
        if next_token is None:
            state.pending_embeds = state.pending_embeds[:, :0]
        else:
            state.pending_embeds = self.embed([next_token])
            state.action_tokens.append(int(next_token))


@dataclass(frozen=True)
class _CachedHead:
    """A reused prompt head (:meth:`TargetVLA._prompt_head`)."""

    stamp: tuple
    embeds: torch.Tensor                                 # (1, S, H) its input embeddings
    hidden: torch.Tensor                                 # (1, S, H) last-layer hidden states
    kv: tuple[tuple[torch.Tensor, torch.Tensor], ...]    # per layer (keys, values)


def tree_attention_mask(past: int, n_ctx: int, tree: DraftTree, dtype: torch.dtype,
                        device) -> torch.Tensor:
    """Additive (1, 1, C + N, past + C + N) mask: 0 = attend, dtype min = blocked.

    Pending rows are causal over the cache and each other; tree rows see the cache, all
    pending positions, their ancestors and themselves. Additive float (not bool) because eager
    attention adds the mask to the scores; SDPA accepts the same float mask.
    """
    n_tree = len(tree)
    q, kv = n_ctx + n_tree, past + n_ctx + n_tree
    allowed = torch.zeros(q, kv, dtype=torch.bool, device=device)
    allowed[:, :past] = True
    allowed[:n_ctx, past:past + n_ctx] = torch.ones(n_ctx, n_ctx, dtype=torch.bool,
                                                     device=device).tril()
    allowed[n_ctx:, past:past + n_ctx] = True
    if n_tree:
        allowed[n_ctx:, past + n_ctx:] = torch.as_tensor(tree.ancestor_matrix(), device=device)
    mask = torch.zeros(q, kv, dtype=dtype, device=device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]
