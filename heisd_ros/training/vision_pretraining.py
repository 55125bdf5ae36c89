r"""An auxiliary objective that teaches the small VLA's vision encoder where things are.

Learning object positions only through the action tokens is slow on a CPU: the signal has to
pass a deep decoder and 256-way classifications of noisy demonstration actions, and an
uncertain model falls back on the marginal's mode (standing still). The auxiliary objective
regresses, from the encoder's patch features of both cameras (flattened, so their layout is
kept) and the proprio pose, dense targets read off the demonstration itself:

* the expert's action (bins mapped to [-1, 1], gripper as -1/1);
* the EE displacement over the next 3 and 8 steps, per axis, in units of 2 cm per step;
* the commanded gripper state 3 and 8 steps ahead.

Future displacement says where the arm is heading, which depends on where the objects and
goals are. A small MLP head reads it; the head is training-only and never shipped. It is
used twice by ``heisd-train-vla``: alone, to pretrain the encoder cheaply (no decoder in the
loop, large batches), and as a weighted extra loss next to the action tokens.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from heisd_ros.actions.bins import N_BINS
from heisd_ros.models.small_vla import SmallVLA, pose_features
from heisd_ros.training.demo_cache import episode_starts
from heisd_ros.training.vla_training import normalise_pixels, train_stage

HORIZONS_STEPS = (3, 8)
DISPLACEMENT_SCALE_M = 0.02
N_TARGETS = 7 + 3 * len(HORIZONS_STEPS) + len(HORIZONS_STEPS)
_HEAD_WIDTH = 256


def aux_targets(bins: np.ndarray, actions: np.ndarray, proprio: np.ndarray,
                episode: np.ndarray) -> np.ndarray:
    """(N, N_TARGETS) float32 regression targets of every demonstration step.

    Args:
        bins: (N, 7) action bins of the steps.
        actions: (N, 7) physical actions (gripper 0 = open, 1 = closed).
        proprio: (N, 7) ``make_proprio`` vectors (position first).
        episode: (N,) episode index; steps of one episode are contiguous and in order.
    """
    n = len(bins)
    starts = episode_starts(episode)
    ends = np.r_[starts[1:], n] - 1                                  # last step of each episode
    last = np.repeat(ends, np.diff(np.r_[starts, n]))
    parts = [np.asarray(bins, np.float32)[:, :6] / ((N_BINS - 1) / 2.0) - 1.0,
             2.0 * np.asarray(actions, np.float32)[:, 6:7] - 1.0]
    position = np.asarray(proprio, np.float32)[:, :3]
    index = np.arange(n)
    for k in HORIZONS_STEPS:
        ahead = np.minimum(index + k, last)
        parts.append(np.clip((position[ahead] - position) / (DISPLACEMENT_SCALE_M * k), -3, 3))
    for k in HORIZONS_STEPS:
        ahead = np.minimum(index + k, last)
        parts.append(2.0 * np.asarray(actions, np.float32)[ahead, 6:7] - 1.0)
    return np.concatenate(parts, axis=1).astype(np.float32)


class VisionAuxHead(nn.Module):
    """Flattened patch features of both cameras + pose features -> the auxiliary targets."""

    def __init__(self, vla: SmallVLA):
        super().__init__()
        config = vla.config
        width = 2 * config.patches_per_camera * config.vision_dim + 10
        self.mlp = nn.Sequential(nn.Linear(width, _HEAD_WIDTH), nn.GELU(),
                                 nn.Linear(_HEAD_WIDTH, _HEAD_WIDTH), nn.GELU(),
                                 nn.Linear(_HEAD_WIDTH, N_TARGETS))

    def forward(self, features: torch.Tensor, proprio: torch.Tensor) -> torch.Tensor:
        """(B * 2, P, D) features (``TwoCameraEncoder.features``), (B, 7) proprio -> (B, T)."""
        b = proprio.shape[0]
        x = torch.cat([features.reshape(b, -1).float(), pose_features(proprio.float())], dim=-1)
        return self.mlp(x)


def aux_loss(head: VisionAuxHead, features: torch.Tensor, proprio: np.ndarray,
             targets: np.ndarray) -> torch.Tensor:
    """Mean Huber loss of the head's predictions against ``targets`` (B, N_TARGETS)."""
    predicted = head(features, torch.as_tensor(np.asarray(proprio, dtype=np.float32)))
    return F.smooth_l1_loss(predicted, torch.as_tensor(targets), beta=0.5)


def pretrain_vision(trainer, steps: int, batch_size: int, lr: float,
                    progress=None, index: np.ndarray | None = None) -> list[float]:
    """Train only the vision encoder and the auxiliary head of ``trainer`` for ``steps``.

    Uses the trainer's batches (same augmentation, same batch RNG, so a seeded run is
    reproducible) and its auxiliary head; AdamW with 50 warmup steps and cosine decay.
    ``index``: the demonstration steps to draw from (default: the trainer's training steps).
    Returns the loss of every step; ``progress(loss)`` is called after each.
    """
    vla, head = trainer.vla, trainer.aux_head
    if head is None:
        raise ValueError("pretrain_vision: the trainer has no auxiliary head (aux_weight 0)")

    def batch_loss(chosen: np.ndarray, batch) -> torch.Tensor:
        features = vla.net.vision.features(normalise_pixels(batch.images), batch.words)
        return aux_loss(head, features, batch.proprio, trainer.aux_targets[chosen])

    return train_stage(trainer, list(vla.net.vision.parameters()) + list(head.parameters()),
                       batch_loss, steps, batch_size, lr, progress, index)
