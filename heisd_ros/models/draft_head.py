"""EAGLE-style draft head: one Llama decoder layer over (target hidden, next-token embedding).

At draft position t the input is ``fc([e_{t+1}; h_t])``: the target's last-layer hidden state
(lm_head input) at t and the input embedding of the token at t + 1; the output is the
predicted hidden state at t + 1, which the target's own lm_head turns into logits for the
token at t + 2 (EAGLE, Li et al. 2024). The head owns only fc, the layer and a final RMSNorm
(the target's hidden states are post-norm); embeddings and lm_head are the target's.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import torch
from torch import nn

from heisd_ros.models.target import MASK_CAPABLE_ATTENTION


@dataclass(frozen=True)
class DraftHeadConfig:
    """Sizes of the draft head; ``hidden_size`` must equal the target's."""

    hidden_size: int = 256
    num_heads: int = 4
    intermediate_size: int = 768
    max_position_embeddings: int = 256
    attn_implementation: str = "eager"

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_heads", "intermediate_size", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"num_heads: {self.num_heads} does not divide hidden_size "
                             f"{self.hidden_size}")
        if self.attn_implementation not in MASK_CAPABLE_ATTENTION:
            raise ValueError(f"attn_implementation: expected one of {MASK_CAPABLE_ATTENTION}, "
                             f"got {self.attn_implementation!r}")

    @classmethod
    def for_target(cls, target) -> DraftHeadConfig:
        """A head sized like one decoder layer of ``target`` (a TargetVLA)."""
        c = target.language_model.config
        return cls(hidden_size=c.hidden_size, num_heads=c.num_attention_heads,
                   intermediate_size=c.intermediate_size,
                   max_position_embeddings=c.max_position_embeddings,
                   attn_implementation=c._attn_implementation)

    def to_json(self) -> str:
        """The config as JSON (stored in the checkpoint metadata)."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> DraftHeadConfig:
        """Config from :meth:`to_json` output."""
        return cls(**json.loads(text))

    def llama_config(self):
        """A one-layer ``LlamaConfig`` for the head's decoder layer and rotary embedding."""
        from transformers import LlamaConfig

        return LlamaConfig(hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
                           num_hidden_layers=1, num_attention_heads=self.num_heads,
                           num_key_value_heads=self.num_heads, vocab_size=8,
                           max_position_embeddings=self.max_position_embeddings,
                           attn_implementation=self.attn_implementation)


class DraftKV:
    """Keys/values of the head's single layer; duck-types ``Cache.update`` for LlamaAttention."""

    def __init__(self):
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Append (B, heads, n, d) keys/values; return all cached ones (``Cache.update``)."""
        if self.keys is None:
            self.keys, self.values = keys, values
        else:
            self.keys = torch.cat([self.keys, keys], dim=2)
            self.values = torch.cat([self.values, values], dim=2)
        return self.keys, self.values

    def crop(self, length: int) -> None:
        """Keep the first ``length`` positions (drop draft-tree entries)."""
        if self.keys is not None:
            self.keys, self.values = self.keys[:, :, :length], self.values[:, :, :length]


class DraftHead(nn.Module):
    """See the module docstring. ``forward`` returns predicted hidden states (1, n, H)."""

    def __init__(self, config: DraftHeadConfig):
        super().__init__()
        from transformers.models.llama.modeling_llama import (
            LlamaDecoderLayer,
            LlamaRMSNorm,
            LlamaRotaryEmbedding,
        )

        self.config = config
        llama = config.llama_config()
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size)
        self.layer = LlamaDecoderLayer(llama, layer_idx=0)
        self.norm = LlamaRMSNorm(config.hidden_size, eps=llama.rms_norm_eps)
        self.rotary = LlamaRotaryEmbedding(llama)
        for module in (self.fc, self.layer):
            for p in module.parameters():
                if p.dim() == 2:
                    nn.init.normal_(p, std=llama.initializer_range)

    def forward(self, hidden: torch.Tensor, next_embeds: torch.Tensor,
                position_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                cache: DraftKV | None = None) -> torch.Tensor:
        """Predicted hidden states (B, n, H) at the positions after each input pair.

        Shapes: hidden, next_embeds (B, n, H); position_ids (B, n); attention_mask additive
        (B, 1, n, len(cache) + n), or None for plain causal attention without a cache.
        """
        x = self.fc(torch.cat([next_embeds, hidden], dim=-1))
        if attention_mask is None:
            n = x.shape[1]
            blocked = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)
            attention_mask = torch.zeros(n, n, dtype=x.dtype, device=x.device)
            attention_mask = attention_mask.masked_fill(blocked, torch.finfo(x.dtype).min)
            attention_mask = attention_mask[None, None]
        rope = self.rotary(x, position_ids=position_ids)
        x = self.layer(x, attention_mask=attention_mask, position_ids=position_ids,
                       past_key_values=cache, use_cache=cache is not None,
                       position_embeddings=rope)
        return self.norm(x)
