"""The subgoal targets, the steps the training stages draw from, and what the action loss trains."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from heisd_ros.actions.normalization import ActionStats
from heisd_ros.models.small_vla import SmallVLA
from heisd_ros.models.subgoal import CLIP, N_TARGETS, SCALE_M
from heisd_ros.training.demo_cache import DemoCache, split_episodes
from heisd_ros.training.subgoal import subgoal_targets
from heisd_ros.training.vla_training import VLATrainConfig, VLATrainer
from test.test_vla_training import TINY_STEM


def test_targets_point_at_the_next_two_gripper_changes():
    # One episode of 8 steps moving 1 cm per step along x; close at step 3, open at step 6.
    position = np.zeros((8, 3), np.float32)
    position[:, 0] = 0.01 * np.arange(8)
    gripper = np.array([0, 0, 0, 1, 1, 1, 0, 0], np.float32)
    targets = subgoal_targets(gripper, position, np.zeros(8, int)) * SCALE_M
    assert targets.shape == (8, N_TARGETS)
    # Step 0: next changes at steps 3 and 6.
    np.testing.assert_allclose(targets[0], [0.03, 0, 0, 0.06, 0, 0], atol=1e-6)
    # Step 3 (the grasp itself): the release at 6, then the episode's last step 7.
    np.testing.assert_allclose(targets[3], [0.03, 0, 0, 0.04, 0, 0], atol=1e-6)
    # After the last change both point at the last step; the last step points at itself.
    np.testing.assert_allclose(targets[6], [0.01, 0, 0, 0.01, 0, 0], atol=1e-6)
    np.testing.assert_allclose(targets[7], 0, atol=1e-6)


def test_targets_stay_inside_their_episode_and_are_clipped():
    position = np.zeros((6, 3), np.float32)
    position[3:, 2] = 5.0                       # a second episode far away (5 m up)
    gripper = np.array([0, 1, 1, 1, 0, 0], np.float32)  # episode 1 starts closed
    episode = np.array([0, 0, 0, 1, 1, 1])
    targets = subgoal_targets(gripper, position, episode)
    # Episode 0 never sees episode 1's positions: its changes are at step 1 only.
    np.testing.assert_allclose(targets[:3], 0, atol=1e-6)
    # Within episode 1 every position is the same: all zero, not 5 m.
    np.testing.assert_allclose(targets[3:], 0, atol=1e-6)
    far = subgoal_targets(np.array([0, 1], np.float32),
                          np.array([[0, 0, 0], [10.0, 0, 0]], np.float32), np.zeros(2, int))
    assert far.max() == CLIP


def test_targets_reject_mismatched_shapes():
    with pytest.raises(ValueError, match="subgoal_targets"):
        subgoal_targets(np.zeros(4), np.zeros((3, 3)), np.zeros(4))


def two_task_cache(episodes_per_task: int = 4, steps: int = 6) -> DemoCache:
    """Same images and poses for both tasks; only the instruction says where the grasp is."""
    rng = np.random.default_rng(0)
    images, proprio, actions, episode, names, texts = [], [], [], [], [], []
    for e in range(2 * episodes_per_task):
        task = e % 2
        images.append(np.full((steps, 2, 32, 32, 3), 128, np.uint8))
        pose = np.zeros((steps, 7), np.float32)
        pose[:, 2] = 0.2
        # The hand heads left (task 0) or right (task 1) and closes at step 3.
        pose[:, 1] = (1 if task else -1) * 0.03 * np.arange(steps)
        pose[:3, 1] = 0.0                       # the first three poses are the same in both
        pose[:, :3] += rng.normal(0, 1e-3, size=(steps, 3))
        proprio.append(pose)
        act = np.zeros((steps, 7), np.float32)
        act[3:, 6] = 1.0
        actions.append(act)
        episode.append(np.full(steps, e))
        names.append(f"suite/task{task}/{e}")
        texts.append("go left" if task == 0 else "go right")
    return DemoCache(np.concatenate(images), np.concatenate(proprio), np.concatenate(actions),
                     np.concatenate(episode), names, texts, "synthetic")


def test_steps_before_the_first_grasp():
    from heisd_ros.training.subgoal import before_first_grasp

    gripper = np.array([0, 0, 1, 0, 1, 0, 0, 0, 1, 1, 0])
    episode = np.array([0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2])
    # Episode 0 closes at step 2 (its re-close later does not count); episode 1 never closes;
    # episode 2 starts closed.
    assert before_first_grasp(gripper, episode).tolist() == [
        True, True, False, False, False, True, True, True, False, False, False]


def test_pretraining_draws_from_the_chosen_suites_before_the_grasp():
    from heisd_ros.tools.train_vla import pretraining_steps

    cache = two_task_cache()
    cache.episode_names[0] = "other/task0/0"                 # a 2nd suite, 2 episodes
    cache.episode_names[2] = "other/task0/2"
    vla = SmallVLA.random(TINY_STEM, seed=0)
    train_index, _ = split_episodes(cache, 1)
    trainer = VLATrainer(vla, cache, train_index, VLATrainConfig(steps=1, batch_size=4),
                         ActionStats.from_actions(cache.actions[train_index]))
    pool = pretraining_steps(trainer, ["suite"], before_grasp=True)
    assert set(cache.episode[pool]) == set(cache.episode[train_index]) - {0, 2}
    assert 0 in set(cache.episode[train_index])
    assert set(pool % 6) == {0, 1, 2}                     # each episode closes at its step 3
    assert len(pretraining_steps(trainer, None, before_grasp=False)) == len(train_index)
    with pytest.raises(ValueError, match="'other', 'suite'"):
        pretraining_steps(trainer, ["piper_object"], before_grasp=False)
    # A focus share: every training step once, plus the focus steps repeated to about that share.
    mixed = pretraining_steps(trainer, ["suite"], before_grasp=True, focus_share=0.75)
    assert set(mixed.tolist()) == set(train_index.tolist())
    share = np.isin(mixed, pool).mean()
    assert abs(share - 0.75) < 0.1 and share > np.isin(train_index, pool).mean()
    with pytest.raises(ValueError, match="share"):
        pretraining_steps(trainer, ["suite"], before_grasp=True, focus_share=0.0)


@pytest.mark.parametrize("what", ["freeze_vision", "train_only"])
def test_frozen_weights_stay_as_they_were_and_the_rest_trains(what):
    cache = two_task_cache()
    vla = SmallVLA.random(TINY_STEM, seed=0)
    before = {n: p.detach().clone() for n, p in vla.net.named_parameters()}
    train_index, _ = split_episodes(cache, 1)
    stats = ActionStats.from_actions(cache.actions[train_index])
    if what == "freeze_vision":
        config = VLATrainConfig(steps=3, batch_size=4, freeze_vision=True)

        def trains(name):
            return not name.startswith("vision.") or name.startswith("vision.projector.")
    else:
        config = VLATrainConfig(steps=3, batch_size=4, lr=1e-2,
                                train_only=("vision.projector.", "proprio."))

        def trains(name):
            return name.startswith(("vision.projector.", "proprio."))
    trainer = VLATrainer(vla, cache, train_index, config, stats)
    for _ in range(3):
        trainer.train_step()
    for name, p in vla.net.named_parameters():
        assert torch.equal(p, before[name]) != trains(name), name
    with pytest.raises(ValueError, match="aux_weight 0"):
        VLATrainConfig(freeze_vision=True, aux_weight=1.0)


def test_train_only_names_what_the_model_has_when_nothing_matches():
    cache = two_task_cache()
    vla = SmallVLA.random(TINY_STEM, seed=0)
    train_index, _ = split_episodes(cache, 1)
    stats = ActionStats.from_actions(cache.actions[train_index])
    with pytest.raises(ValueError, match=r"starts with \['decoder\.'\].*'vision\.projector\.'\]$"):
        VLATrainer(vla, cache, train_index,
                   VLATrainConfig(steps=1, batch_size=4, train_only=("decoder.",)), stats)
    with pytest.raises(ValueError, match="freeze_vision"):
        VLATrainConfig(train_only=("llm.",), freeze_vision=True)
    with pytest.raises(ValueError, match="non-empty"):
        VLATrainConfig(train_only=("",))
