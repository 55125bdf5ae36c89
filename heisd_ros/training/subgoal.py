r"""The subgoal pathway's targets and its own training stage: where the hand goes next.

With several objects on the table, the action tokens only say *which* object to reach once
the arm is close to it; far from it, the first steps towards two objects differ by a few
millimetres. A small model trained only on the action tokens then learns a scene prior ("go
to the object that is usually the answer") and ignores the object word of the instruction.

The subgoal pathway (``small_vla.SubgoalPathway``) regresses, per demonstration step, where
the end effector will be at the demonstration's next two gripper changes:

* the EE displacement (x, y, z) from the current position to the position at the next step
  whose gripper command differs from the previous step's (the grasp, or the release once
  the object is held);
* the displacement to the gripper change after that (the release, or the next grasp).

Where no such change is left in the episode, the episode's last position stands in. These
targets depend on the instruction as much as on the image (the same scene, another object
word, another grasp point). :func:`pretrain_subgoal_pathway` trains the pathway's encoder and
head on them (``heisd-train-vla --pathway-steps``); the action loss never does.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F

from heisd_ros.models.subgoal import CLIP, N_TARGETS, SCALE_M, SUBGOALS
from heisd_ros.training.demo_cache import episode_starts
from heisd_ros.training.vla_training import normalise_pixels, train_stage


def subgoal_targets(gripper: np.ndarray, position_m: np.ndarray,
                    episode: np.ndarray) -> np.ndarray:
    """(N, N_TARGETS) float32 regression targets of every demonstration step.

    Args:
        gripper: (N,) commanded gripper state of each step (0 open, 1 closed).
        position_m: (N, 3) EE position of each step (m).
        episode: (N,) episode index; steps of one episode are contiguous and in order.

    Returns:
        Per step, the displacement to the EE position at each of the next ``SUBGOALS``
        gripper changes (or the episode's last position), in units of ``SCALE_M``, clipped
        to +-``CLIP``.
    """
    gripper = np.asarray(gripper, np.float32) >= 0.5
    position_m = np.asarray(position_m, np.float32)
    episode = np.asarray(episode)
    n = len(gripper)
    if not (position_m.shape == (n, 3) and episode.shape == (n,)):
        raise ValueError(f"subgoal_targets: expected (N,), (N, 3), (N,) with N = {n}, got "
                         f"{gripper.shape}, {position_m.shape}, {episode.shape}")
    targets = np.zeros((n, N_TARGETS), np.float32)
    starts = episode_starts(episode)
    for start, end in zip(starts, np.r_[starts[1:], n], strict=True):
        g, p = gripper[start:end], position_m[start:end]
        changes = np.nonzero(g[1:] != g[:-1])[0] + 1            # steps whose command differs
        for i in range(len(g)):
            ahead = changes[changes > i][:SUBGOALS]
            ahead = np.r_[ahead, np.full(SUBGOALS - len(ahead), len(g) - 1)]  # last step
            targets[start + i] = (p[ahead] - p[i]).reshape(-1)
    return np.clip(targets / SCALE_M, -CLIP, CLIP)


def before_first_grasp(gripper: np.ndarray, episode: np.ndarray) -> np.ndarray:
    """(N,) bool: the steps of each episode before its first closing gripper command.

    There the first subgoal is the grasp point of the object to pick: the steps that need the
    instruction to be read (every step of an episode that never closes).
    """
    closed = np.asarray(gripper, np.float32) >= 0.5
    episode = np.asarray(episode)
    mask = np.zeros(len(closed), bool)
    starts = episode_starts(episode)
    for start, end in zip(starts, np.r_[starts[1:], len(closed)], strict=True):
        shut = np.nonzero(closed[start:end])[0]
        mask[start:start + (shut[0] if len(shut) else end - start)] = True
    return mask


def pathway_loss(vla, batch, targets: np.ndarray) -> torch.Tensor:
    """Mean Huber loss of ``vla``'s subgoal pathway on a trainer ``batch`` against ``targets``."""
    pathway = vla.net.subgoal
    predicted = pathway.predict(normalise_pixels(batch.images), batch.subgoal_words,
                                torch.as_tensor(np.asarray(batch.proprio, np.float32)))
    return F.smooth_l1_loss(predicted, torch.as_tensor(np.asarray(targets, np.float32)),
                            beta=0.5)


def pretrain_subgoal_pathway(trainer, steps: int, batch_size: int, lr: float,
                             progress=None, index: np.ndarray | None = None) -> list[float]:
    """The subgoal pathway's own stage: its encoder and head regress the subgoal targets.

    Nothing else of the model changes (the pathway's embedding is not used here). See
    ``vla_training.train_stage`` for the schedule, ``index`` and the return value.
    """
    pathway = trainer.vla.net.subgoal
    if pathway is None:
        raise ValueError("pretrain_subgoal_pathway: the model has no subgoal pathway "
                         "(SmallVLA.with_subgoal_pathway adds one)")
    return train_stage(
        trainer, list(pathway.encoder.parameters()) + list(pathway.head.parameters()),
        lambda chosen, batch: pathway_loss(trainer.vla, batch, trainer.pathway_targets[chosen]),
        steps, batch_size, lr, progress, index)
