"""The small VLA: prompt layout, configs, vocabulary, and checkpoints that fail clearly."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from heisd_ros.data.observation import Observation
from heisd_ros.decoding.decoder import ActionDecoder
from heisd_ros.models.checkpoint import (
    load_draft_head,
    load_small_vla,
    save_draft_head,
    save_small_vla,
)
from heisd_ros.models.draft_head import DraftHead, DraftHeadConfig
from heisd_ros.models.small_vla import SmallVLA, SmallVLANet
from heisd_ros.models.small_vla_config import SmallVLAConfig
from heisd_ros.models.vocab import ByteVocab
from test.fixtures_decoding import TINY, scenes


def test_prompt_layout_and_vision_features(tiny_random_vla):
    vla = tiny_random_vla
    obs = scenes(1, seed=0)[0]
    prefix = vla.encode(obs)
    text = len(vla.prompt_ids(obs.instruction)) - 1          # without bos
    assert prefix.embeds.shape == (1, 1 + 2 * TINY.patches_per_camera + text, TINY.hidden_size)
    assert prefix.vision_features.shape == (2, TINY.vision_dim)
    assert vla.vocab.decode_text(vla.prompt_ids(obs.instruction)) == \
        f"In: {obs.instruction.lower()}\nOut:"
    # The instruction reaches the prompt: a different one changes the embeddings.
    other = Observation(obs.image_primary, obs.image_wrist, "touch the purple block")
    start = 1 + 2 * TINY.patches_per_camera + len("In: ")     # first instruction byte
    assert not torch.equal(vla.encode(other).embeds[:, start], prefix.embeds[:, start])
    torch.testing.assert_close(vla.encode(other).embeds[:, -5:], prefix.embeds[:, -5:])
    no_wrist = vla.encode(Observation(obs.image_primary, None, obs.instruction))
    assert not torch.equal(no_wrist.vision_features[1], prefix.vision_features[1])


def test_proprio_token():
    config = SmallVLAConfig(**{**TINY.__dict__, "proprio_dim": 3})
    vla = SmallVLA.random(config, seed=0)
    obs = scenes(1, seed=0)[0]
    with_proprio = Observation(obs.image_primary, obs.image_wrist, obs.instruction,
                               proprio=np.array([0.1, 0.2, 0.3]))
    base = vla.encode(obs).embeds.shape[1]
    assert vla.encode(with_proprio).embeds.shape[1] == base
    with pytest.raises(ValueError, match="proprio"):
        vla.encode(Observation(obs.image_primary, None, "x", proprio=np.zeros(4)))


@pytest.mark.parametrize("field,value", [("hidden_size", 0), ("num_heads", 5),
                                         ("patch_size_px", 7),
                                         ("attn_implementation", "flash_attention_2"),
                                         ("vocab_base", 400), ("model_vocab_size", 500),
                                         ("max_position_embeddings", 20)])
def test_config_errors_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SmallVLAConfig(**{**TINY.__dict__, field: value})


def test_config_json_roundtrip_and_unknown_fields():
    assert SmallVLAConfig.from_json(TINY.to_json()) == TINY
    with pytest.raises(ValueError, match="unknown"):
        SmallVLAConfig.from_json(json.dumps({"hidden_sise": 3}))


def test_byte_vocab():
    vocab = ByteVocab()
    assert vocab.actions.first_id == 259 and vocab.actions.vocab_base == 515
    ids = vocab.encode_text("pick é", max_bytes=64)
    assert max(ids) < vocab.actions.first_id and vocab.decode_text(ids) == "pick é"
    with pytest.raises(ValueError, match="vocab_base"):
        ByteVocab(vocab_base=514)


def test_default_config_size_and_draft_cost_ratio():
    """Shipped size stays small; a draft head has < 1/8 of the decoder's per-token weights.

    FLOPs per token are proportional to the weights touched; timing lives in heisd-bench.
    """
    config = SmallVLAConfig()
    net = SmallVLANet(config)
    params = sum(p.numel() for p in net.parameters())
    assert params * 2 < 40e6                         # fp16 bytes: tens of MB at most
    head = DraftHead(DraftHeadConfig(hidden_size=config.hidden_size, num_heads=config.num_heads,
                                     intermediate_size=config.intermediate_size))
    head_params = sum(p.numel() for p in head.parameters()) + 256 * config.hidden_size
    decoder = sum(p.numel() for n, p in net.llm.named_parameters() if "embed_tokens" not in n)
    assert head_params / decoder < 1 / 8


def test_checkpoint_roundtrip(tmp_path, tiny_random_vla):
    path = save_small_vla(tiny_random_vla, tmp_path / "vla.safetensors", dtype="float32")
    loaded = load_small_vla(path)
    for obs in scenes(3, seed=1):
        np.testing.assert_array_equal(ActionDecoder(loaded).decode(obs).tokens,
                                      ActionDecoder(tiny_random_vla).decode(obs).tokens)
    half = load_small_vla(save_small_vla(tiny_random_vla, tmp_path / "h.safetensors"))
    assert (tmp_path / "h.safetensors").stat().st_size < path.stat().st_size * 0.6
    assert half.language_model.dtype == torch.float32


def rewrite(src, dst, tensors=None, metadata=None):
    """Copy a checkpoint, changing some tensors and/or metadata entries."""
    from safetensors import safe_open

    with safe_open(str(src), framework="pt") as handle:
        meta = dict(handle.metadata())
    data = load_file(str(src))
    data.update(tensors or {})
    data = {k: v for k, v in data.items() if v is not None}
    meta.update(metadata or {})
    save_file(data, str(dst), metadata={k: v for k, v in meta.items() if v is not None})
    return dst


def test_bad_target_checkpoints_fail_clearly(tmp_path, tiny_random_vla):
    good = save_small_vla(tiny_random_vla, tmp_path / "good.safetensors")
    with pytest.raises(FileNotFoundError, match="missing.safetensors"):
        load_small_vla(tmp_path / "missing.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"not a checkpoint at all")
    with pytest.raises(ValueError, match="not a readable safetensors"):
        load_small_vla(tmp_path / "junk.safetensors")
    wrong_shape = rewrite(good, tmp_path / "shape.safetensors",
                          {"llm.model.layers.0.mlp.up_proj.weight": torch.zeros(3, 3)})
    with pytest.raises(ValueError, match=r"llm.model.layers.0.mlp.up_proj.weight.*\(3, 3\)"):
        load_small_vla(wrong_shape)
    missing = rewrite(good, tmp_path / "missing_t.safetensors", {"vision.norm.bias": None})
    with pytest.raises(ValueError, match="missing.*vision.norm.bias"):
        load_small_vla(missing)
    fmt = rewrite(good, tmp_path / "fmt.safetensors", metadata={"format": "openvla"})
    with pytest.raises(ValueError, match="format='openvla'"):
        load_small_vla(fmt)
    layout = rewrite(good, tmp_path / "layout.safetensors", metadata={"action_ids": "id = bin"})
    with pytest.raises(ValueError, match="vocabulary layout"):
        load_small_vla(layout)
    base = rewrite(good, tmp_path / "base.safetensors", metadata={"vocab_base": "600"})
    with pytest.raises(ValueError, match="vocab_base"):
        load_small_vla(base)
    rows = torch.zeros(500, TINY.hidden_size)
    short_vocab = rewrite(good, tmp_path / "rows.safetensors", {"llm.lm_head.weight": rows})
    with pytest.raises(ValueError, match="lm_head has 500 rows"):
        load_small_vla(short_vocab)


def test_bad_draft_head_checkpoints_fail_clearly(tmp_path, tiny_random_vla):
    head = DraftHead(DraftHeadConfig.for_target(tiny_random_vla))
    path = save_draft_head(head, tmp_path / "head.safetensors", tiny_random_vla)
    loaded = load_draft_head(path, tiny_random_vla)
    torch.testing.assert_close(loaded.fc.weight, head.fc.weight)
    other = SmallVLA.random(SmallVLAConfig(**{**TINY.__dict__, "hidden_size": 32}), seed=0)
    with pytest.raises(ValueError, match="hidden_size 64 does not match the target's 32"):
        load_draft_head(path, other)
    bigger_vocab = SmallVLA.random(SmallVLAConfig(**{**TINY.__dict__, "vocab_base": 520}), seed=0)
    with pytest.raises(ValueError, match="vocabulary layout mismatch"):
        load_draft_head(path, bigger_vocab)
    with pytest.raises(ValueError, match="heisd-draft-head"):
        load_draft_head(save_small_vla(tiny_random_vla, tmp_path / "vla.safetensors"),
                        tiny_random_vla)
    bad = rewrite(path, tmp_path / "bad.safetensors", {"fc.weight": torch.zeros(64, 64)})
    with pytest.raises(ValueError, match="fc.weight"):
        load_draft_head(bad, tiny_random_vla)
