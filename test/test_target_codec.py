"""Decoders un-normalise with the statistics the target was trained on, not defaults."""

from __future__ import annotations

import numpy as np

from heisd_ros.actions.normalization import ActionCodec, ActionStats
from heisd_ros.decoding.decoder import ActionDecoder
from heisd_ros.models.small_vla import SmallVLA
from test.fixtures_decoding import TINY, scenes

TRAINED_STATS = ActionStats(q01=[-0.02, -0.01, -0.03, -0.1, -0.2, -0.3, 0.0],
                            q99=[0.02, 0.03, 0.01, 0.1, 0.2, 0.3, 1.0])


def test_random_target_uses_default_statistics():
    vla = SmallVLA.random(TINY, seed=0)
    assert np.array_equal(vla.codec.stats.q99, ActionStats().q99)


def test_decoder_defaults_to_the_targets_trained_statistics():
    vla = SmallVLA.random(TINY, seed=0)
    vla.action_stats = TRAINED_STATS
    decoder = ActionDecoder(vla)
    result = decoder.decode(scenes(1, seed=3)[0])
    assert np.allclose(result.action, ActionCodec(TRAINED_STATS).decode(result.bins))
    assert not np.allclose(result.action[:6], ActionCodec().decode(result.bins)[:6])


def test_an_explicit_codec_wins():
    vla = SmallVLA.random(TINY, seed=0)
    vla.action_stats = TRAINED_STATS
    explicit = ActionCodec(ActionStats(q01=[-1.0] * 6 + [0.0], q99=[1.0] * 6 + [1.0]))
    vla.codec = explicit
    assert ActionDecoder(vla).codec is explicit
