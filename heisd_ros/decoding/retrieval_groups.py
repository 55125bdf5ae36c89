"""Kinematic groups of the 7 action tokens and the bin <-> vocabulary-id mapping.

The sequence-wise retrieval tree (``retrieval_tree``) and its relaxed acceptance
(``retrieval_accept``) work on groups: position (dims 0-2), rotation (3-5) and gripper (6).
Bin b has token id ``vocab_base - 1 - b`` (OpenVLA: vocab_base = 32000). Pure numpy.
"""

from __future__ import annotations

import numpy as np

GROUPS: tuple[tuple[int, ...], ...] = ((0, 1, 2), (3, 4, 5), (6,))
GROUP_NAMES: tuple[str, ...] = ("position", "rotation", "gripper")
GRIPPER_GROUP = 2
NUM_BINS = 256


def tokens_from_bins(bins: np.ndarray, vocab_base: int) -> np.ndarray:
    """Vocabulary ids of action bins (OpenVLA: the last 256 ids, reversed)."""
    return vocab_base - 1 - np.asarray(bins, dtype=np.int64)


def bins_from_tokens(tokens: np.ndarray, vocab_base: int) -> np.ndarray:
    """Action bins of vocabulary ids (inverse of :func:`tokens_from_bins`)."""
    return vocab_base - 1 - np.asarray(tokens, dtype=np.int64)
