"""Reference greedy decoding with ``transformers``' own ``generate`` (for checking our AR).

The language model generates 7 tokens from the prefix embeddings with ``do_sample=False``
and a logits processor that masks every non-action id, i.e. the same restriction our
decoders apply. It shares no code with ``speculative_step``, so agreement is evidence.
"""

from __future__ import annotations

import numpy as np
import torch

from heisd_ros.actions.bins import ActionTokenMap
from heisd_ros.data.observation import ACTION_DIM, Observation
from heisd_ros.models.target import TargetVLA


class ActionOnlyLogitsProcessor:
    """``transformers`` LogitsProcessor: scores of non-action ids become -inf."""

    def __init__(self, actions: ActionTokenMap):
        self.actions = actions

    def __call__(self, input_ids: torch.LongTensor,
                 scores: torch.FloatTensor) -> torch.FloatTensor:
        """Scores (B, V) with every non-action column at -inf."""
        masked = torch.full_like(scores, float("-inf"))
        lo, hi = self.actions.first_id, self.actions.vocab_base
        masked[:, lo:hi] = scores[:, lo:hi]
        return masked


@torch.no_grad()
def hf_generate_action(target: TargetVLA, observation: Observation) -> np.ndarray:
    """(7,) action token ids from ``generate(inputs_embeds=prefix, do_sample=False)``."""
    from transformers import LogitsProcessorList

    prefix = target.encode(observation)
    length = prefix.embeds.shape[1]
    out = target.language_model.generate(
        inputs_embeds=prefix.embeds,
        attention_mask=torch.ones(1, length, dtype=torch.long, device=target.device),
        max_new_tokens=ACTION_DIM, min_new_tokens=ACTION_DIM, do_sample=False,
        num_beams=1, eos_token_id=None, pad_token_id=0,
        logits_processor=LogitsProcessorList([ActionOnlyLogitsProcessor(target.actions)]))
    # With inputs_embeds only, generate returns just the new tokens.
    return out[0, -ACTION_DIM:].cpu().numpy()
