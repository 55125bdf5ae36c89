"""The one interface every draft source implements (drafter head, retrieval, hybrids).

A decoder calls ``propose(context)`` before each target forward and ``feedback(accepted)``
after the acceptance rule ran. A source without probabilities (retrieval) leaves
``DraftTree.log_probs`` as None; a source with nothing to offer returns None or an empty tree
(the decoder then runs a plain AR step).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import torch

from heisd_ros.data.observation import Observation
from heisd_ros.models.draft_tree import DraftTree


@dataclass(frozen=True)
class DraftContext:
    """What a source may use to draft the next tokens of the current action.

    Attributes:
        observation: the observation being decoded.
        vision_features: (n_cameras, D) pooled vision features of the target (float32, CPU).
        action_tokens: committed action token ids so far (the last one is not forwarded yet).
        max_depth: tokens still needed; deeper tree nodes are dropped by the decoder.
        committed_length: sequence length so far (prompt + committed action tokens); the
            proposed tree's roots sit at this position.
        hidden: (1, T, H) target last-layer hidden states (lm_head input) of every position
            forwarded so far in this action (prompt, then action tokens), T =
            committed_length - 1; None before the prefill. A stateful source keeps how far
            it has read, so it may skip rounds (a hybrid calls it only on some).
        next_embeds: (1, T, H) input embedding of the position after each of them.
        first_call: True on this source's first call for the current action.
        action_id: unique per decoded action (process-wide); a source that is not called
            on every round resets its per-action state when this changes.
    """

    observation: Observation
    vision_features: torch.Tensor
    action_tokens: tuple[int, ...]
    max_depth: int
    committed_length: int
    hidden: torch.Tensor | None
    next_embeds: torch.Tensor | None
    first_call: bool
    action_id: int = 0


@dataclass(frozen=True)
class AcceptedDraft:
    """Outcome of verifying one proposed tree.

    Attributes:
        tree: the tree as verified (after depth limiting).
        accepted_nodes: accepted node indices along one root-to-node path.
        target_bins: (N,) the target's argmax bin at each node's position.
        bonus_token: the target's token appended after the path (None when the action was
            already complete).
    """

    tree: DraftTree
    accepted_nodes: tuple[int, ...]
    target_bins: np.ndarray
    bonus_token: int | None


class DraftSource(ABC):
    """Proposes token trees; learns from what the target accepted."""

    #: Short name reported in StepStats.draft_source and the HybridStep status.
    name: str = "draft"

    @abstractmethod
    def propose(self, context: DraftContext) -> DraftTree | None:
        """A draft tree for the next tokens (roots at ``context.committed_length``)."""

    def feedback(self, accepted: AcceptedDraft) -> None:
        """Called after every verification of this source's tree; default: ignore."""
        return None

    @property
    def forwards(self) -> int:
        """Model forwards spent by the last ``propose`` (0 for model-free sources)."""
        return 0

    @property
    def retrieval_calls(self) -> int:
        """Vector-DB queries made by the last ``propose``."""
        return 0
