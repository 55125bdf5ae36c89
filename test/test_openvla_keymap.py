"""The key map covers a real OpenVLA-7B checkpoint's full key set (built on the meta device).

Expected names come from the published architecture, written independently of the adapter in
``openvla_fixtures`` (timm ViT naming + Prismatic's LayerScale rename; the language model from
``transformers.LlamaForCausalLM``): DINOv2 ViT-L/14 with 4 registers (24 blocks), SigLIP
So400m/14 (27 blocks + attention-pool head), the fused projector, 32 Llama-2 layers with a
32064-row vocabulary. ``test_openvla_timm`` checks the backbone names against timm itself.

What OpenVLA never runs (Prismatic: ``get_intermediate_layers(n={len(blocks) - 2})``; public
loaders that prune agree: DINOv2 block 23, SigLIP block 26 and ``attn_pool``): each backbone's
last block and final norm, and SigLIP's attention pool.
"""

import json

import pytest

from heisd_ros.models.openvla.config import read_prismatic_config
from heisd_ros.models.openvla.keymap import check_plan_covers, key_plan, map_state
from heisd_ros.models.openvla.loader import build_meta_net
from heisd_ros.models.openvla.shards import check_against_plan
from heisd_ros.models.openvla.vit import OPENVLA_VITS
from test.openvla_fixtures import published_names

# Llama-2-7B as published (not the adapter's defaults table).
LLAMA2_7B = {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 32}
# The config.json of openvla-7b: transformers 4.40.1 saved only the non-default text fields.
REAL_CONFIG = {
    "arch_specifier": "no-align+fused-gelu-mlp", "image_resize_strategy": "resize-naive",
    "image_sizes": [224, 224], "llm_backbone_id": "llama2-7b-pure", "model_type": "openvla",
    "n_action_bins": 256, "pad_to_multiple_of": 64, "pad_token_id": 32000,
    "text_config": {"model_type": "llama", "pad_token_id": 32000, "torch_dtype": "bfloat16",
                    "vocab_size": 32064},
    "timm_model_ids": ["vit_large_patch14_reg4_dinov2.lvd142m", "vit_so400m_patch14_siglip_224"],
    "timm_override_act_layers": [None, None], "use_fused_vision_backbone": True,
    "vision_backbone_id": "dinosiglip-vit-so-224px",
}
DINO, SIGLIP = "vision_backbone.featurizer.", "vision_backbone.fused_featurizer."


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    directory = tmp_path_factory.mktemp("openvla7b")
    (directory / "config.json").write_text(json.dumps(REAL_CONFIG))
    spec = read_prismatic_config(directory)
    net, shapes = build_meta_net(spec, "sdpa")
    published = published_names(tuple(OPENVLA_VITS.values()), LLAMA2_7B, vocab_size=32064)
    return directory, spec, net, shapes, key_plan(spec, shapes), published


def test_partial_text_config_means_llama2_7b(real):
    _, spec, net, _, _, _ = real
    assert (spec.hidden_size, spec.vocab_size, spec.vocab_base, spec.vision_dim) == (
        4096, 32064, 32000, 2176)
    config = net.language_model.config
    assert (config.num_hidden_layers, config.num_attention_heads, config.intermediate_size,
            config.max_position_embeddings, config.rms_norm_eps) == (32, 32, 11008, 2048, 1e-6)
    assert [v.depth for v in spec.vision] == [24, 27]
    assert spec.patches_per_image == 256


def test_plan_is_exactly_the_published_key_set(real):
    directory, _, _, _, plan, published = real
    assert len(published) == 343 + 342 + 6 + 291  # DINOv2, SigLIP, projector, Llama-2-7B
    assert plan.shapes == published
    check_against_plan(directory, published, plan)  # what loading a real index would run


def test_every_tensor_is_mapped_and_only_unrun_ones_are_unused(real):
    _, _, _, shapes, plan, published = real
    unused = ({f"{DINO}blocks.23.{k}" for k in _block_keys(layer_scale=True)}
              | {f"{DINO}norm.weight", f"{DINO}norm.bias"}
              | {f"{SIGLIP}blocks.26.{k}" for k in _block_keys(layer_scale=False)}
              | {f"{SIGLIP}norm.weight", f"{SIGLIP}norm.bias"}
              | {k for k in published if k.startswith(f"{SIGLIP}attn_pool.")})
    assert len(unused) == 14 + 2 + 12 + 2 + 13
    assert plan.unused == unused
    assert set(plan.targets) == set(published) - unused
    check_plan_covers(plan, shapes)               # every module tensor filled exactly once
    filled = [n for names in plan.targets.values() for n in names]
    assert sorted(filled) == sorted(shapes)


def test_qkv_is_split_into_q_k_v_rows(real):
    import torch

    _, _, _, _, plan, _ = real
    name = f"{DINO}blocks.0.attn.qkv.weight"
    assert plan.targets[name] == tuple(f"{DINO}blocks.0.attention.{p}.weight"
                                       for p in ("q_proj", "k_proj", "v_proj"))
    assert plan.targets[f"{SIGLIP}blocks.3.attn.proj.bias"] == (
        f"{SIGLIP}blocks.3.self_attn.out_proj.bias",)
    assert plan.targets[f"{DINO}blocks.22.ls2.scale_factor"] == (
        f"{DINO}blocks.22.layer_scale2.lambda1",)
    qkv = torch.arange(3 * 4 * 2, dtype=torch.float32).reshape(12, 2)
    small = type(plan)(shapes={"a": (12, 2)}, targets={"a": ("q", "k", "v")}, unused=frozenset())
    state = map_state(small, {"a": qkv})
    assert [state[k][0, 0].item() for k in "qkv"] == [0.0, 8.0, 16.0]


def _block_keys(layer_scale: bool) -> set[str]:
    keys = {f"{m}.{p}" for m in ("norm1", "norm2", "attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")
            for p in ("weight", "bias")}
    return keys | ({"ls1.scale_factor", "ls2.scale_factor"} if layer_scale else set())
