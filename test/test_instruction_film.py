"""The vision stem conditioned on the instruction words (FiLM): identity at first, then real.

The subgoal pathway's encoder is such a stem (``small_vla.SubgoalPathway``).
"""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np
import pytest
import torch

from heisd_ros.actions.normalization import ActionStats
from heisd_ros.data.observation import Observation
from heisd_ros.decoding.decoder import ActionDecoder
from heisd_ros.models.checkpoint import load_small_vla, save_small_vla
from heisd_ros.models.small_vla import SmallVLA, SmallVLANet
from heisd_ros.models.small_vla_config import SmallVLAConfig
from heisd_ros.models.vision import instruction_words
from test.test_vla_training import TINY_FILM, TINY_STEM


def observation(instruction: str, seed: int = 0) -> Observation:
    rng = np.random.default_rng(seed)
    return Observation(image_primary=rng.integers(0, 256, (32, 32, 3), dtype=np.uint8),
                       image_wrist=rng.integers(0, 256, (32, 32, 3), dtype=np.uint8),
                       instruction=instruction,
                       proprio=rng.normal(0, 0.1, 7).astype(np.float32))


def tokens(vla: SmallVLA, obs: Observation) -> list[int]:
    return ActionDecoder(vla).decode(obs).tokens.tolist()


def randomise_film(vla: SmallVLA, std: float = 0.5) -> None:
    with torch.no_grad():
        vla.net.vision.film.mlp[-1].weight.normal_(0.0, std)


def test_words_are_hashed_stably_and_ignore_case_and_punctuation():
    ids = instruction_words("Put the RED block, in the basket!", 1024)
    assert ids == instruction_words("put the red block in the basket", 1024)
    assert len(ids) == 7 and all(0 <= i < 1024 for i in ids)
    assert ids[1] == ids[5]                                   # "the" twice, one bucket
    # CRC-32, not Python's per-process salted hash: a fixed value.
    assert instruction_words("red", 1 << 32) == [zlib.crc32(b"red")]
    assert instruction_words("", 16) == []


def test_film_is_identity_until_trained():
    film = SmallVLA.random(TINY_FILM, seed=1, lm_head_scale=8.0)
    # The same weights without the FiLM module.
    net = SmallVLANet(TINY_STEM)
    missing, unexpected = net.load_state_dict(film.net.state_dict(), strict=False)
    assert not missing and unexpected and all(k.startswith("vision.film.") for k in unexpected)
    base = SmallVLA(net)
    for text in ("put the red block in the basket", "put the green can in the basket"):
        obs = observation(text)
        torch.testing.assert_close(base.encode(obs).embeds, film.encode(obs).embeds)
        assert tokens(base, obs) == tokens(film, obs)


def test_trained_film_makes_the_vision_features_depend_on_the_instruction():
    vla = SmallVLA.random(TINY_FILM, seed=2)
    randomise_film(vla)
    red, green = (vla.encode(observation(f"put the {c} block in the basket"))
                  for c in ("red", "green"))
    patches = slice(1, 1 + 2 * TINY_FILM.patches_per_camera)
    assert not torch.allclose(red.embeds[:, patches], green.embeds[:, patches], atol=1e-4)
    assert not torch.allclose(red.vision_features, green.vision_features, atol=1e-5)
    # Same words in another case and punctuation: the same features.
    same = vla.encode(observation("Put the RED block in the basket."))
    torch.testing.assert_close(red.vision_features, same.vision_features)


def test_batched_features_equal_one_sample_at_a_time():
    vla = SmallVLA.random(TINY_FILM, seed=3)
    randomise_film(vla)
    vision = vla.net.vision.eval()
    texts = ["put the red block in the basket", "stack the blue block on the red block"]
    obs = [observation(t, seed=k) for k, t in enumerate(texts)]
    pixels = torch.stack([vision.pixels([o.image_primary, o.image_wrist]) for o in obs])
    with torch.no_grad():
        batched = vision.features(pixels, vision.word_ids(texts))
        single = torch.cat([vision.features(pixels[k:k + 1], vision.word_ids([t]))
                            for k, t in enumerate(texts)])
    torch.testing.assert_close(batched, single, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="conditioned on the instruction"):
        vision.features(pixels)


def assert_checkpoint_round_trip(vla: SmallVLA, path) -> None:
    """Saved and loaded, ``vla`` has its config and decodes the same tokens."""
    vla.action_stats = ActionStats.from_actions(np.random.default_rng(0).normal(0, 0.01, (50, 7)))
    path = save_small_vla(vla, path, dtype="float32",
                          extra={"action_stats": vla.action_stats.to_json()})
    loaded = load_small_vla(path)
    assert loaded.config == vla.config
    obs = observation("put the yellow block in the basket")
    assert tokens(loaded, obs) == tokens(vla, obs)


def test_film_checkpoint_round_trip(tmp_path):
    vla = SmallVLA.random(TINY_FILM, seed=4, lm_head_scale=8.0)
    randomise_film(vla)
    assert_checkpoint_round_trip(vla, tmp_path / "film.safetensors")


def test_config_needs_the_stem():
    with pytest.raises(ValueError, match="stem_channels"):
        dataclasses.replace(TINY_STEM, stem_channels=0, instruction_film=8)
    with pytest.raises(ValueError, match="instruction_film"):
        SmallVLAConfig(stem_channels=8, instruction_film=-1)


def test_fingerprint_hashes_film_only_when_it_is_on():
    from heisd_ros.retrieval.embedding import model_fingerprint

    plain = SmallVLA.random(TINY_STEM, seed=4)
    assert "instruction_film" not in plain.config.identity_json()
    other_buckets = dataclasses.replace(TINY_STEM, instruction_buckets=77)
    assert other_buckets.identity_json() == TINY_STEM.identity_json()   # FiLM off: no effect
    on = dataclasses.replace(TINY_STEM, instruction_film=8)
    assert '"instruction_film": 8' in on.identity_json()
    assert on.identity_json() != dataclasses.replace(on, instruction_buckets=77).identity_json()
    assert model_fingerprint(SmallVLA.random(on, seed=4)) != model_fingerprint(plain)
