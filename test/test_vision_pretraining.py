"""The auxiliary vision objective: its targets, and that both training stages use it."""

from __future__ import annotations

import numpy as np
import pytest

from heisd_ros.actions.normalization import ActionStats
from heisd_ros.models.small_vla import SmallVLA
from heisd_ros.training.demo_cache import split_episodes
from heisd_ros.training.vision_pretraining import (
    DISPLACEMENT_SCALE_M,
    HORIZONS_STEPS,
    N_TARGETS,
    aux_targets,
    pretrain_vision,
)
from heisd_ros.training.vla_training import VLATrainConfig, VLATrainer
from test.test_vla_training import TINY_STEM, synthetic_cache


def test_targets_look_ahead_within_the_episode_only():
    n = 12
    episode = np.array([0] * 5 + [1] * 7)
    proprio = np.zeros((n, 7), np.float32)
    proprio[:, 0] = np.arange(n) * 0.01                   # x grows 1 cm per step
    actions = np.zeros((n, 7), np.float32)
    actions[3:5, 6] = 1.0                                  # gripper closes at step 3
    bins = np.full((n, 7), 255)
    bins[:, 0] = 0
    targets = aux_targets(bins, actions, proprio, episode)
    assert targets.shape == (n, N_TARGETS)
    assert np.allclose(targets[:, 0], -1.0) and np.allclose(targets[:, 1:6], 1.0)
    assert targets[2, 6] == -1.0 and targets[3, 6] == 1.0
    k = HORIZONS_STEPS[0]
    dx = targets[:, 7]
    # Step 0 looks k steps ahead; step 3 of episode 0 stops at its last step (4), never
    # reaching into episode 1; the last step of an episode has no displacement.
    assert dx[0] == pytest.approx(0.01 * k / (DISPLACEMENT_SCALE_M * k))
    assert dx[3] == pytest.approx(0.01 / (DISPLACEMENT_SCALE_M * k))
    assert dx[4] == 0.0 and dx[n - 1] == 0.0
    gripper_ahead = targets[:, 7 + 3 * len(HORIZONS_STEPS)]
    assert gripper_ahead[0] == 1.0 and gripper_ahead[5] == -1.0


def test_pretraining_and_joint_training_lower_the_auxiliary_loss():
    cache = synthetic_cache(n_episodes=6, steps=8)
    train_index, _ = split_episodes(cache, 1)
    config = VLATrainConfig(steps=10, batch_size=8, lr=3e-3, warmup_steps=2, seed=0,
                            aux_weight=1.0)
    trainer = VLATrainer(SmallVLA.random(TINY_STEM, seed=0), cache, train_index, config,
                         ActionStats.from_actions(cache.actions[train_index]))
    before = trainer.evaluate(train_index)["aux_loss"]
    losses = pretrain_vision(trainer, steps=40, batch_size=8, lr=3e-3)
    after = trainer.evaluate(train_index)["aux_loss"]
    assert len(losses) == 40 and after < before
    for _ in range(10):
        trainer.train_step()
    state = trainer.state_dict()
    assert state["aux_head"] is not None
    clone = VLATrainer(SmallVLA.random(TINY_STEM, seed=1), cache, train_index, config,
                       ActionStats.from_actions(cache.actions[train_index]))
    clone.load_state_dict(state)
    assert clone.evaluate(train_index) == trainer.evaluate(train_index)
