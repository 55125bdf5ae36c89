"""OpenVLA-compatible action bins and their token ids.

A normalised action value in [-1, 1] becomes one of 256 bins; bin ``b`` is vocabulary id
``vocab_base - 1 - b``, so the 256 action ids are the last 256 ids below ``vocab_base``
(OpenVLA: vocab_base = 32000, the Llama-2 tokenizer size; ids >= vocab_base are padding).

Binning follows OpenVLA's ``ActionTokenizer`` exactly: 256 uniform edges on [-1, 1],
``np.digitize`` gives 1..256 (bin = digitize - 1), and decoding uses the 255 centres between
edges, so bin 255 (only reached at exactly +1.0) decodes like bin 254.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

N_BINS = 256

_EDGES = np.linspace(-1.0, 1.0, N_BINS)
_CENTRES = (_EDGES[:-1] + _EDGES[1:]) / 2.0


def values_to_bins(normalised: np.ndarray) -> np.ndarray:
    """Bins 0..255 (int64) of normalised values; values are clipped to [-1, 1] first."""
    clipped = np.clip(np.asarray(normalised, dtype=np.float64), -1.0, 1.0)
    return np.digitize(clipped, _EDGES).astype(np.int64) - 1


def bins_to_values(bins: np.ndarray) -> np.ndarray:
    """Normalised values in [-1, 1] of bins 0..255 (OpenVLA's centre lookup)."""
    arr = np.asarray(bins, dtype=np.int64)
    if arr.size and (arr.min() < 0 or arr.max() >= N_BINS):
        raise ValueError(f"bins: expected values in 0..{N_BINS - 1}, got {arr.tolist()}")
    return _CENTRES[np.clip(arr, 0, N_BINS - 2)]


@dataclass(frozen=True)
class ActionTokenMap:
    """The mapping between bins and vocabulary ids of one model.

    Attributes:
        vocab_base: id just past the action ids (OpenVLA: 32000). The model's embedding table
            may be larger (padding rows); those ids are never actions.
        n_bins: number of action bins (OpenVLA: 256).
    """

    vocab_base: int
    n_bins: int = N_BINS

    def __post_init__(self) -> None:
        if self.n_bins != N_BINS:
            raise ValueError(f"n_bins: only OpenVLA's {N_BINS} bins are supported, "
                             f"got {self.n_bins}")
        if not isinstance(self.vocab_base, int) or self.vocab_base < self.n_bins:
            raise ValueError(f"vocab_base: expected an int >= {self.n_bins}, "
                             f"got {self.vocab_base!r}")

    @property
    def first_id(self) -> int:
        """Smallest action id (the id of bin 255)."""
        return self.vocab_base - self.n_bins

    def token_of_bin(self, bins):
        """Vocabulary ids of bins (works on ints, numpy arrays and tensors)."""
        return self.vocab_base - 1 - bins

    def bin_of_token(self, token_ids):
        """Bins of vocabulary ids, or -1 where an id is not an action id."""
        if hasattr(token_ids, "masked_fill"):  # a torch tensor; torch is not imported here
            bins = self.vocab_base - 1 - token_ids
            return bins.masked_fill((bins < 0) | (bins >= self.n_bins), -1)
        if isinstance(token_ids, (int, np.integer)):
            b = self.vocab_base - 1 - int(token_ids)
            return b if 0 <= b < self.n_bins else -1
        bins = self.vocab_base - 1 - np.asarray(token_ids, dtype=np.int64)
        return np.where((bins >= 0) & (bins < self.n_bins), bins, -1)

    def is_action(self, token_ids):
        """True where an id is one of the 256 action ids."""
        return (token_ids >= self.first_id) & (token_ids < self.vocab_base)

    # The logits helpers take torch tensors; this module stays importable without torch
    # because the CPU-only retrieval side uses the bins.
    def action_logits(self, logits):
        """The action-id columns of ``logits`` (..., V), in ascending id order (..., 256)."""
        if logits.shape[-1] < self.vocab_base:
            raise ValueError(f"logits: last dimension {logits.shape[-1]} is smaller than "
                             f"vocab_base {self.vocab_base}")
        return logits[..., self.first_id:self.vocab_base]

    def argmax_token(self, logits):
        """Greedy token restricted to the action ids.

        Ties go to the lowest id, like a full ``argmax`` over logits whose non-action ids are
        masked to -inf (what ``generate`` with a masking LogitsProcessor does).
        """
        return self.action_logits(logits).argmax(dim=-1) + self.first_id

    def argmax_bin(self, logits):
        """Greedy bin restricted to the action ids, (...,) int64."""
        return self.vocab_base - 1 - self.argmax_token(logits)
