"""The tiny OpenVLA checkpoint, loaded by the adapter, runs every decoding mode on the CPU.

Lossless: AR greedy equals transformers' ``generate`` (an independent decoder) and every
exact-verification mode (EAGLE drafter, retrieval group tree with correct and wrong drafts,
zero-tolerance group rule) reproduces AR token for token. Relaxed modes stay within their
radius of AR.
"""

import numpy as np
import pytest
import torch

from heisd_ros.actions.bins import bins_to_values
from heisd_ros.data.observation import Observation
from heisd_ros.decoding.acceptance import RelaxedRule, exact_rule
from heisd_ros.decoding.decoder import ActionDecoder
from heisd_ros.decoding.draft_source import DraftSource
from heisd_ros.decoding.drafter_source import DrafterSource
from heisd_ros.decoding.hf_reference import hf_generate_action
from heisd_ros.decoding.retrieval_accept import GroupAcceptConfig, GroupRule
from heisd_ros.decoding.retrieval_tree import GroupTreeConfig, build_group_tree
from heisd_ros.models.draft_head import DraftHead, DraftHeadConfig
from heisd_ros.models.openvla.config import OpenVLAOptions
from heisd_ros.models.openvla.loader import load_openvla
from heisd_ros.models.openvla.processor import pixel_values
from test.openvla_fixtures import STATS, TINY_VISION, write_tiny_openvla

INSTRUCTIONS = ("Pick up the black bowl", "open the top drawer ",
                "Put the cream cheese in the bowl")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_tiny_openvla(tmp_path_factory.mktemp("tiny_openvla"))


@pytest.fixture(scope="module")
def target(checkpoint):
    return load_openvla(checkpoint, OpenVLAOptions(vision=TINY_VISION, unnorm_key="libero_spatial"))


def _observation(seed: int, wrist: bool = True) -> Observation:
    rng = np.random.default_rng(seed)
    primary = rng.integers(0, 256, (200, 240, 3), dtype=np.uint8)
    wrist_image = rng.integers(0, 256, (96, 96, 3), dtype=np.uint8) if wrist else None
    return Observation(image_primary=primary, image_wrist=wrist_image,
                       instruction=INSTRUCTIONS[seed % len(INSTRUCTIONS)])


@pytest.fixture(scope="module")
def ar(target):
    decoder = ActionDecoder(target, codec=target.codec)
    return {seed: decoder.decode(_observation(seed)) for seed in range(3)}


def test_loads_on_cpu_in_fp32_with_the_chosen_statistics(target):
    assert target.device.type == "cpu" and target.dtype == torch.float32
    assert target.unnorm_key == "libero_spatial_no_noops"
    assert target.actions.vocab_base == 32000 and target.hidden_size == 64
    assert target.language_model.get_output_embeddings().weight.shape[0] == 32064


def test_prefix_is_bos_patches_prompt(target):
    obs = _observation(0)
    prefix = target.encode(obs)
    ids = target.prompt.ids(obs.instruction)
    assert ids[0] == 1 and ids[-1] == 29871
    assert prefix.embeds.shape == (1, 1 + 256 + len(ids) - 1, 64)
    text = target.embed(ids)[0]
    torch.testing.assert_close(prefix.embeds[0, 0], text[0])
    torch.testing.assert_close(prefix.embeds[0, 257:], text[1:])
    pixels = pixel_values([obs.image_primary], TINY_VISION, 224)
    with torch.no_grad():
        tokens = target.net.projector(target.net.vision_backbone(pixels))[0]
    torch.testing.assert_close(prefix.embeds[0, 1:257], tokens)


def test_target_sees_only_the_primary_camera_and_retrieval_both(target):
    with_wrist, other_wrist = _observation(0), _observation(3)
    other = Observation(with_wrist.image_primary, other_wrist.image_wrist, with_wrist.instruction)
    a, b = target.encode(with_wrist), target.encode(other)
    torch.testing.assert_close(a.embeds, b.embeds)
    assert a.vision_features.shape == (2, 80) and a.vision_features.dtype == torch.float32
    torch.testing.assert_close(a.vision_features[0], b.vision_features[0])
    assert not torch.allclose(a.vision_features[1], b.vision_features[1])
    no_wrist = target.encode(_observation(0, wrist=False)).vision_features
    assert torch.equal(no_wrist[1], torch.zeros(80))


def test_ar_matches_transformers_generate(target, ar):
    for seed, result in ar.items():
        np.testing.assert_array_equal(result.tokens, hf_generate_action(target, _observation(seed)))
        assert result.stats.target_forwards == 7
        assert ((result.bins >= 0) & (result.bins < 256)).all()


def test_actions_are_unnormalised_with_dataset_statistics(ar):
    action = STATS["libero_spatial_no_noops"]["action"]
    q01, q99 = np.array(action["q01"]), np.array(action["q99"])
    for result in ar.values():
        normalised = bins_to_values(result.bins)
        expected = 0.5 * (normalised + 1) * (q99 - q01) + q01   # OpenVLA's predict_action
        np.testing.assert_allclose(result.action[:6], expected[:6])
        # OpenVLA's gripper says 1 = open; the project's 1 = closed.
        assert result.action[6] == (0.0 if normalised[6] > 0.5 else 1.0)


def test_codec_round_trips_the_project_gripper_convention(target):
    action = np.array([0.1, -0.2, 0.3, 0.01, -0.02, 0.03, 1.0])       # closed
    bins = target.codec.encode(action)
    assert bins[6] == 127          # raw 1 - 1.0 = 0.0 ("closed" in Open-X terms) -> bin 127
    np.testing.assert_allclose(target.codec.decode(bins), action, atol=0.02)


def test_drafter_exact_is_lossless(target, ar):
    head = DraftHead(DraftHeadConfig.for_target(target))
    decoder = ActionDecoder(target, DrafterSource(head, target), exact_rule, codec=target.codec)
    for seed, result in ar.items():
        drafted = decoder.decode(_observation(seed))
        np.testing.assert_array_equal(drafted.tokens, result.tokens)
        s = drafted.stats
        assert s.drafter_forwards > 0
        # the prefill, then one verification round per draft; each round ran the head
        assert s.target_forwards == 1 + len(s.accepted_lengths)
        assert 1 + sum(s.accepted_lengths) == 7
        assert s.drafter_forwards >= len(s.accepted_lengths)


class KnownDrafts(DraftSource):
    """Retrieval stand-in: a group tree of given candidate bins, proposed at the prefill."""

    name = "retrieval"

    def __init__(self, vocab_base: int):
        self.vocab_base, self.candidates = vocab_base, None

    def propose(self, context):
        if not context.first_call or self.candidates is None:
            return None
        return build_group_tree(self.candidates, self.vocab_base, GroupTreeConfig()).to_draft_tree()


@pytest.mark.parametrize("rule", [exact_rule, GroupRule(GroupAcceptConfig(0, 0))],
                         ids=["exact", "group-zero-tolerance"])
def test_retrieval_exact_is_lossless(target, ar, rule):
    source = KnownDrafts(target.actions.vocab_base)
    decoder = ActionDecoder(target, source, rule, codec=target.codec, draft_in_prefill=True)
    for seed, result in ar.items():
        wrong = (result.bins + 40) % 256
        for candidates, forwards in (([result.bins, wrong], 1), ([wrong, result.bins], 1),
                                     ([wrong], 7)):
            source.candidates = np.stack(candidates)
            drafted = decoder.decode(_observation(seed))
            np.testing.assert_array_equal(drafted.tokens, result.tokens)
            assert drafted.stats.target_forwards == forwards


def test_relaxed_modes_accept_near_drafts(target, ar):
    source = KnownDrafts(target.actions.vocab_base)
    relaxed = ActionDecoder(target, source, RelaxedRule((9,) * 6 + (0,)), codec=target.codec,
                            draft_in_prefill=True)
    grouped = ActionDecoder(target, source, GroupRule(), codec=target.codec, draft_in_prefill=True)
    for seed, result in ar.items():
        near = np.clip(result.bins + np.array([5, -5, 3, -3, 2, -2, 0]), 0, 255)
        source.candidates = near[None]
        out = relaxed.decode(_observation(seed))
        assert out.bins[0] == near[0]           # same context as AR: |5| <= 9 is accepted
        assert out.stats.target_forwards < 7
        out = grouped.decode(_observation(seed))
        assert out.bins[0] in (near[0], result.bins[0])
        assert ((out.bins >= 0) & (out.bins < 256)).all() and out.stats.target_forwards <= 7
