"""The subgoal pathway: an instruction-conditioned encoder whose subgoals feed the decoder."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from heisd_ros.actions.normalization import ActionStats
from heisd_ros.data.observation import Observation
from heisd_ros.decoding.decoder import ActionDecoder
from heisd_ros.models.checkpoint import load_small_vla
from heisd_ros.models.small_vla import SmallVLA, SmallVLANet
from heisd_ros.training.demo_cache import split_episodes
from heisd_ros.training.subgoal import pretrain_subgoal_pathway, subgoal_targets
from heisd_ros.training.vla_training import (
    PATHWAY_PREDICTOR,
    VLATrainConfig,
    VLATrainer,
    action_loss,
)
from test.test_instruction_film import assert_checkpoint_round_trip, observation, tokens
from test.test_subgoal import two_task_cache
from test.test_vla_training import TINY, TINY_STEM


def make_it_matter(vla: SmallVLA, std: float = 0.5) -> None:
    """Random weights in the two zero-initialised layers (the embedding and the FiLM)."""
    pathway = vla.net.subgoal
    with torch.no_grad():
        pathway.embed[-1].weight.normal_(0.0, std)
        pathway.encoder.film.mlp[-1].weight.normal_(0.0, std)


def instruction_first(vla: SmallVLA) -> SmallVLA:
    """The same weights with the prompt laid out instruction first."""
    net = SmallVLANet(dataclasses.replace(vla.config, prompt_layout="instruction_first"))
    net.load_state_dict(vla.net.state_dict())
    return SmallVLA(net)


def test_added_pathway_leaves_the_actions_unchanged_until_trained():
    base = SmallVLA.random(TINY_STEM, seed=1, lm_head_scale=8.0)
    base.gripper_switch_probability = 0.4
    base.action_stats = ActionStats.from_actions(
        np.random.default_rng(0).normal(size=(50, 7)).astype(np.float32))
    with_pathway = base.with_subgoal_pathway(8)
    assert with_pathway.config.subgoal_pathway == 8 and base.config.subgoal_pathway == 0
    for text in ("put the red block in the basket", "put the green can in the basket"):
        obs = observation(text)
        torch.testing.assert_close(base.encode(obs).embeds, with_pathway.encode(obs).embeds)
        assert tokens(base, obs) == tokens(with_pathway, obs)
    assert with_pathway.gripper_switch_probability == 0.4
    assert with_pathway.action_stats is base.action_stats
    # Warm start: the pathway's encoder is the main encoder (its FiLM new).
    main = base.net.vision.state_dict()
    copied = with_pathway.net.subgoal.encoder.state_dict()
    assert {k for k in main if not k.startswith(("projector.", "film."))} == {
        k for k in copied if not k.startswith("film.")}
    for key, value in copied.items():
        if not key.startswith("film."):
            assert torch.equal(value, main[key]), key
    with pytest.raises(ValueError, match="already"):
        with_pathway.with_subgoal_pathway(8)
    # Its new weights come from the seed, not from the global RNG.
    head = with_pathway.net.subgoal.head[0].weight
    assert torch.equal(base.with_subgoal_pathway(8).net.subgoal.head[0].weight, head)
    assert not torch.equal(base.with_subgoal_pathway(8, seed=1).net.subgoal.head[0].weight, head)


def test_a_trained_pathway_tells_the_decoder_where_the_named_object_is():
    base = SmallVLA.random(TINY_STEM, seed=2)
    vla = base.with_subgoal_pathway(8)
    make_it_matter(vla)
    added = {}
    for colour in ("red", "green"):
        obs = observation(f"put the {colour} block in the basket")
        ours, theirs = vla.encode(obs), base.encode(obs)
        # Only the last prompt token (it predicts the first action token) gets the prediction.
        torch.testing.assert_close(ours.embeds[:, :-1], theirs.embeds[:, :-1])
        added[colour] = ours.embeds[0, -1] - theirs.embeds[0, -1]
        # The retrieval feature is the main encoder's, which does not read the instruction.
        torch.testing.assert_close(ours.vision_features, theirs.vision_features)
    assert not torch.allclose(added["red"], added["green"], atol=1e-4)
    # The instruction-first layout: the last prompt token is the proprio token, after the
    # instruction-only head whose keys/values are reused.
    first, first_path = instruction_first(base), instruction_first(vla)
    obs = observation("put the red block in the basket")
    ours, theirs = first_path.encode(obs), first.encode(obs)
    assert ours.static_length == theirs.static_length < ours.embeds.shape[1] - 1
    torch.testing.assert_close(ours.embeds[:, :-1], theirs.embeds[:, :-1])
    assert not torch.allclose(ours.embeds[:, -1], theirs.embeds[:, -1], atol=1e-4)


def test_checkpoint_round_trip(tmp_path):
    vla = SmallVLA.random(TINY_STEM, seed=4, lm_head_scale=8.0).with_subgoal_pathway(8)
    make_it_matter(vla)
    assert_checkpoint_round_trip(vla, tmp_path / "pathway.safetensors")


def test_config_needs_a_stem_and_a_proprio_token_and_is_fingerprinted_only_when_on():
    from heisd_ros.retrieval.embedding import model_fingerprint

    with pytest.raises(ValueError, match="stem_channels > 0 and proprio_dim > 0"):
        dataclasses.replace(TINY, subgoal_pathway=8)                # no stem
    with pytest.raises(ValueError, match="stem_channels > 0 and proprio_dim > 0"):
        dataclasses.replace(TINY_STEM, proprio_dim=0, subgoal_pathway=8)
    with pytest.raises(ValueError, match="subgoal_pathway"):
        dataclasses.replace(TINY_STEM, subgoal_pathway=-1)
    assert "subgoal_pathway" not in TINY_STEM.identity_json()
    on = dataclasses.replace(TINY_STEM, subgoal_pathway=8)
    assert '"subgoal_pathway": 8' in on.identity_json()
    # The pathway hashes the instruction words into the buckets, so they count.
    assert on.identity_json() != dataclasses.replace(on, instruction_buckets=77).identity_json()
    plain = SmallVLA.random(TINY_STEM, seed=4)
    assert model_fingerprint(plain.with_subgoal_pathway(8)) != model_fingerprint(plain)


def pathway_trainer(vla: SmallVLA, cache, **options) -> VLATrainer:
    train_index, _ = split_episodes(cache, 1)
    config = VLATrainConfig(**{"steps": 3, "batch_size": 4, "lr": 1e-2, "seed": 0, **options})
    return VLATrainer(vla, cache, train_index, config,
                      ActionStats.from_actions(cache.actions[train_index]))


def test_the_action_loss_trains_the_decoder_and_embedding_but_never_the_predictor():
    cache = two_task_cache()
    vla = SmallVLA.random(TINY_STEM, seed=0).with_subgoal_pathway(8)
    before = {n: p.detach().clone() for n, p in vla.net.named_parameters()}
    trainer = pathway_trainer(vla, cache)
    for _ in range(3):
        trainer.train_step()
    for name, p in vla.net.named_parameters():
        assert torch.equal(p, before[name]) == name.startswith(PATHWAY_PREDICTOR), name
    # With the vision encoder frozen too, as in the run that ships such a model.
    vla = SmallVLA.random(TINY_STEM, seed=0).with_subgoal_pathway(8)
    before = {n: p.detach().clone() for n, p in vla.net.named_parameters()}
    trainer = pathway_trainer(vla, cache, freeze_vision=True)
    for _ in range(3):  # the embedding's first layer moves once its zero output layer has
        trainer.train_step()
    for name, p in vla.net.named_parameters():
        fixed = name.startswith(PATHWAY_PREDICTOR) or (
            name.startswith("vision.") and not name.startswith("vision.projector."))
        assert torch.equal(p, before[name]) == fixed, name
    with pytest.raises(ValueError, match="never trains"):
        pathway_trainer(vla, cache, train_only=("subgoal.head.",))


def test_the_embedding_learns_at_its_own_rate():
    cache = two_task_cache()
    vla = SmallVLA.random(TINY_STEM, seed=0).with_subgoal_pathway(8)
    trainer = pathway_trainer(vla, cache, pathway_lr_factor=30.0)
    trainer.train_step()
    embed = {id(p) for p in vla.net.subgoal.embed.parameters()}
    rates = {}
    for group in trainer.optimizer.param_groups:
        kinds = {id(p) in embed for p in group["params"]}
        assert len(kinds) <= 1                      # a group is all embedding or none of it
        for kind in kinds:
            rates.setdefault(kind, set()).add(group["lr"])
    assert len(rates[True]) == len(rates[False]) == 1
    assert rates[True].pop() == pytest.approx(30.0 * rates[False].pop())
    assert sum(len(g["params"]) for g in trainer.optimizer.param_groups) == len(
        [p for p in vla.net.parameters() if p.requires_grad])
    with pytest.raises(ValueError, match="pathway_lr_factor"):
        VLATrainConfig(pathway_lr_factor=float("nan"))


def test_the_pathway_stage_trains_only_the_predictor_and_lowers_its_loss():
    cache = two_task_cache()
    vla = SmallVLA.random(TINY_STEM, seed=0).with_subgoal_pathway(8)
    trainer = pathway_trainer(vla, cache)
    np.testing.assert_array_equal(trainer.pathway_targets, subgoal_targets(
        cache.actions[:, -1], cache.proprio[:, :3], cache.episode))
    before = {n: p.detach().clone() for n, p in vla.net.named_parameters()}
    first = trainer.evaluate(trainer.train_index)["pathway_loss"]
    losses = pretrain_subgoal_pathway(trainer, 150, 8, 3e-3)
    assert len(losses) == 150 and all(np.isfinite(losses))
    # The images are all grey: only the instruction ("go left"/"go right") tells the sides apart.
    assert trainer.evaluate(trainer.train_index)["pathway_loss"] < 0.6 * first
    for name, p in vla.net.named_parameters():
        assert torch.equal(p, before[name]) != name.startswith(PATHWAY_PREDICTOR), name
        # The stage hands the predictor back frozen for the action loss.
        assert p.requires_grad != name.startswith(PATHWAY_PREDICTOR), name
    with pytest.raises(ValueError, match="no subgoal pathway"):
        pretrain_subgoal_pathway(pathway_trainer(SmallVLA.random(TINY_STEM, seed=0), cache),
                                 1, 4, 1e-3)


def test_batched_loss_matches_the_single_sample_decode_path():
    cache = two_task_cache()
    vla = SmallVLA.random(TINY_STEM, seed=3, lm_head_scale=8.0).with_subgoal_pathway(8)
    make_it_matter(vla)
    trainer = pathway_trainer(vla, cache)
    vla.net.eval()
    i = 4
    obs = Observation(image_primary=np.ascontiguousarray(cache.images[i, 0]),
                      image_wrist=np.ascontiguousarray(cache.images[i, 1]),
                      instruction=cache.episode_instructions[cache.episode[i]],
                      proprio=cache.proprio[i])
    other = 7                                # "go right": a prompt one byte longer than i's
    assert len(trainer.prompts[cache.episode[other]]) == len(trainer.prompts[cache.episode[i]]) + 1
    batch = trainer._batch(np.asarray([i, other]), augment=False)
    with torch.no_grad():
        result = ActionDecoder(vla).decode(obs)
        # Teacher forcing with the greedy bins reproduces the greedy decode, with the
        # prediction at sample i's own last prompt token in a right-padded batch.
        bins = np.stack([result.bins, trainer.bins[other]])
        predicted = action_loss(vla, batch.images, batch.prompts, bins, batch.proprio,
                                subgoal_words=batch.subgoal_words).predicted
    assert predicted[0].tolist() == list(result.bins)
    with pytest.raises(ValueError, match="subgoal_words"):
        action_loss(vla, batch.images, batch.prompts, bins, batch.proprio)


def test_command_line_adds_the_pathway_trains_it_then_the_decoder(tmp_path):
    from heisd_ros.tools import train_vla
    from test.test_vla_training import cli_base_model

    common = cli_base_model(tmp_path, "--stem-channels", "8", "--proprio")
    base = tmp_path / "a" / "small_vla.safetensors"
    staged = ["--init-from", str(base), "--subgoal-pathway", "8", "--pathway-steps", "3",
              "--pretrain-batch-size", "4", "--freeze-vision", "--pathway-lr-factor", "10"]
    assert train_vla.main(common + ["--out", str(tmp_path / "b"), *staged]) == 0
    start = load_small_vla(base).net
    tuned = load_small_vla(tmp_path / "b" / "small_vla.safetensors")
    assert tuned.config.subgoal_pathway == 8
    # The pathway's encoder started as the main one and its stage moved it.
    moved = [n for n, p in start.vision.named_parameters() if not n.startswith("projector.")
             and not torch.equal(p, dict(tuned.net.subgoal.encoder.named_parameters())[n])]
    assert moved
    card = json.loads((tmp_path / "b" / "card.json").read_text())
    stage = card["subgoal_pathway_stage"]
    assert stage["steps"] == 3 and np.isfinite(stage["val_pathway_loss_after"])
    assert "pathway_loss" in card["final_validation"]
    assert card["training"]["pathway_lr_factor"] == 10.0
    with pytest.raises(ValueError, match="--subgoal-pathway WIDTH"):
        train_vla.main(common + ["--out", str(tmp_path / "c"), "--init-from", str(base),
                                 "--pathway-steps", "2"])


def test_command_line_builds_the_shipped_model_in_one_run(tmp_path):
    """As the shipped model's pathway trained: its stage, then only its embedding, in one run."""
    from heisd_ros.tools import train_vla
    from test.test_vla_training import cli_base_model

    common = cli_base_model(tmp_path, "--stem-channels", "8", "--proprio")
    base = tmp_path / "a" / "small_vla.safetensors"
    assert train_vla.main(common + [
        "--out", str(tmp_path / "b"), "--init-from", str(base), "--subgoal-pathway", "8",
        "--pathway-steps", "3", "--pretrain-suites", "suite", "--pretrain-before-grasp",
        "--pretrain-focus-share", "0.5", "--pretrain-batch-size", "4", "--pretrain-lr", "1e-3",
        "--train-only", "subgoal.embed.", "--lr", "1e-3", "--pathway-lr-factor", "30"]) == 0
    start = dict(load_small_vla(base).net.named_parameters())
    tuned = dict(load_small_vla(tmp_path / "b" / "small_vla.safetensors").net.named_parameters())
    # Every weight of the starting model is as it was; the pathway's parts all trained.
    for name, param in start.items():
        assert torch.equal(tuned[name], param), name
    start_encoder = load_small_vla(base).net.vision.state_dict()
    encoder = {n: p for n, p in tuned.items() if n.startswith("subgoal.encoder.")}
    assert any(not torch.equal(p, start_encoder[n.removeprefix("subgoal.encoder.")])
               for n, p in encoder.items() if n.removeprefix("subgoal.encoder.") in start_encoder)
    assert tuned["subgoal.embed.2.weight"].abs().sum() > 0      # trained away from zero
    card = json.loads((tmp_path / "b" / "card.json").read_text())
    assert card["subgoal_pathway_stage"]["steps"] == 3
    assert card["training"]["train_only"] == ["subgoal.embed."]
