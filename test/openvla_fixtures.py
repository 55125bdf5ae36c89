"""A tiny random OpenVLA checkpoint in the real on-disk layout, and the naming behind it.

The layout mirrors ``openvla/openvla-7b`` and its LIBERO fine-tunes: ``config.json`` (partial
``text_config``, as transformers 4.40.1 saved it), bf16 safetensors shards
``model-0000k-of-0000n.safetensors`` with ``model.safetensors.index.json``,
``dataset_statistics.json``, ``preprocessor_config.json``, ``generation_config.json`` and a
Llama-style tokenizer (``tokenizer.json`` with byte fallback, "▁" at id 29871, ``<PAD>`` =
32000) built locally with ``tokenizers``. Only the sizes are tiny: the backbones are ViTs of
the DINOv2-reg4 and SigLIP families, the decoder a 2-layer Llama with OpenVLA's vocabulary
(32064 rows, actions at 31744..31999).

Tensor names are written here from the published architecture, independently of the
adapter's key map: timm's ``VisionTransformer`` (``patch_embed.proj``, ``cls_token``,
``reg_token``, ``pos_embed``, ``blocks.N.{norm1, attn.qkv, attn.proj, ls1, norm2, mlp.fc1,
mlp.fc2, ls2}``, ``norm``, SigLIP's ``attn_pool.{latent, q, kv, proj, norm, mlp}``), with
Prismatic's LayerScale rename ``gamma`` -> ``scale_factor``; the projector ``fc1..fc3``; the
language model from ``transformers.LlamaForCausalLM`` itself (built on the meta device).

Regenerate: nothing is stored; every test writes the fixture into its tmp directory.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import torch

from heisd_ros.models.openvla.vit import HALF, HALF_STD, ViTSpec

TINY_VISION = (
    ViTSpec("tiny_vit_reg4_dinov2", "dinov2", embed_dim=32, depth=3, num_heads=2, mlp_dim=128,
            reg_tokens=4, class_token=True),
    ViTSpec("tiny_vit_siglip", "siglip", embed_dim=48, depth=3, num_heads=2, mlp_dim=96,
            class_token=False, mean=HALF, std=HALF_STD),
)
TINY_TEXT = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 512}
VOCAB_SIZE, PAD_ID, SPACE_ID = 32064, 32000, 29871
ACTION = {"q01": [-0.7, -0.8, -0.9, -0.1, -0.2, -0.3, 0.0],
          "q99": [0.8, 0.9, 0.9, 0.1, 0.2, 0.3, 1.0], "mask": [True] * 6 + [False]}
STATS = {
    "libero_spatial_no_noops": {"action": ACTION, "num_transitions": 100, "num_trajectories": 4},
    "bridge_orig": {"action": {**ACTION, "q01": [-0.03] * 6 + [0.0], "q99": [0.03] * 6 + [1.0]}},
}


def timm_vit_names(spec: ViTSpec, image_px: int = 224) -> dict[str, tuple[int, ...]]:
    """Names and shapes of a timm ViT's state dict as Prismatic saves it."""
    d, m, p = spec.embed_dim, spec.mlp_dim, spec.patch_px
    out = {"patch_embed.proj.weight": (d, 3, p, p), "patch_embed.proj.bias": (d,),
           "pos_embed": (1, (image_px // p) ** 2, d), "norm.weight": (d,), "norm.bias": (d,)}
    if spec.class_token:
        out["cls_token"] = (1, 1, d)
    if spec.reg_tokens:
        out["reg_token"] = (1, spec.reg_tokens, d)
    linears = {"attn.qkv": (3 * d, d), "attn.proj": (d, d), "mlp.fc1": (m, d), "mlp.fc2": (d, m)}
    for i in range(spec.depth):
        for name in ("norm1", "norm2"):
            out.update({f"blocks.{i}.{name}.weight": (d,), f"blocks.{i}.{name}.bias": (d,)})
        for name, (o, n) in linears.items():
            out.update({f"blocks.{i}.{name}.weight": (o, n), f"blocks.{i}.{name}.bias": (o,)})
        if spec.family == "dinov2":
            out.update({f"blocks.{i}.ls1.scale_factor": (d,), f"blocks.{i}.ls2.scale_factor": (d,)})
    if spec.family == "siglip":
        out.update({"attn_pool.latent": (1, 1, d), "attn_pool.norm.weight": (d,),
                    "attn_pool.norm.bias": (d,)})
        for name, (o, n) in {"q": (d, d), "kv": (2 * d, d), "proj": (d, d),
                             "mlp.fc1": (m, d), "mlp.fc2": (d, m)}.items():
            out.update({f"attn_pool.{name}.weight": (o, n), f"attn_pool.{name}.bias": (o,)})
    return out


def published_names(vision: tuple[ViTSpec, ViTSpec], text: dict, vocab_size: int = VOCAB_SIZE,
                    image_px: int = 224) -> dict[str, tuple[int, ...]]:
    """Every tensor name and shape of an OpenVLA checkpoint with these sizes."""
    from transformers import LlamaConfig, LlamaForCausalLM

    names = {}
    for prefix, spec in zip(("featurizer", "fused_featurizer"), vision, strict=True):
        names.update({f"vision_backbone.{prefix}.{k}": s
                      for k, s in timm_vit_names(spec, image_px).items()})
    vision_dim, hidden = sum(v.embed_dim for v in vision), text["hidden_size"]
    for name, (o, n) in {"fc1": (4 * vision_dim, vision_dim), "fc2": (hidden, 4 * vision_dim),
                         "fc3": (hidden, hidden)}.items():
        names.update({f"projector.{name}.weight": (o, n), f"projector.{name}.bias": (o,)})
    with torch.device("meta"):
        llm = LlamaForCausalLM(LlamaConfig(**text, vocab_size=vocab_size))
    names.update({f"language_model.{k}": tuple(v.shape) for k, v in llm.state_dict().items()})
    return names


def _random_tensor(name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    if name.endswith("scale_factor"):
        return 0.5 + 0.1 * torch.randn(shape, generator=gen)
    if "norm" in name.rsplit(".", 2)[-2]:
        base = 1.0 if name.endswith("weight") else 0.0
        return base + 0.05 * torch.randn(shape, generator=gen)
    if name.endswith("lm_head.weight"):     # peaked logits: greedy choices far from ties
        return 4.0 * torch.randn(shape, generator=gen) / shape[1] ** 0.5
    if len(shape) >= 2 and "embed" not in name and "token" not in name:
        fan_in = int(torch.tensor(shape[1:]).prod())
        return torch.randn(shape, generator=gen) / fan_in ** 0.5
    return 0.5 * torch.randn(shape, generator=gen)


def _tokenizer_files(directory: Path) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

    words = ("In", "What", "action", "should", "the", "robot", "take", "to", "Out")
    merges = list(dict.fromkeys(("\u2581" + w[:i], w[i]) for w in words for i in range(len(w))))
    pieces = [*(string.ascii_letters + string.digits + ".,:;?!'-"), *(a + b for a, b in merges)]
    free = iter(i for i in range(3 + 256, PAD_ID) if i != SPACE_ID)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)},
             "\u2581": SPACE_ID}                 # Llama-2's "▁" id
    for piece in pieces:
        if piece not in vocab:
            vocab[piece] = next(free)
    vocab.update({f"<unused{i}>": i for i in free})   # dense ids 0..31999
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>",
                               byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                           normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<unk>", "<s>", "</s>")])
    tok.add_special_tokens([AddedToken("<PAD>", special=True, normalized=False)])
    tok.save(str(directory / "tokenizer.json"))
    _json(directory / "tokenizer_config.json", {
        "add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "pad_token": "<PAD>", "legacy": False, "model_max_length": 2048,
        "padding_side": "right", "clean_up_tokenization_spaces": False,
        "processor_class": "PrismaticProcessor", "tokenizer_class": "LlamaTokenizer"})
    _json(directory / "special_tokens_map.json", {"bos_token": "<s>", "eos_token": "</s>",
                                                  "unk_token": "<unk>", "pad_token": "<PAD>"})
    _json(directory / "added_tokens.json", {"<PAD>": PAD_ID})


def _json(path: Path, value) -> None:
    path.write_text(json.dumps(value, indent=2))


def write_tiny_openvla(directory, seed: int = 0, n_shards: int = 3,
                       vision: tuple[ViTSpec, ViTSpec] = TINY_VISION) -> Path:
    """Write the tiny checkpoint into ``directory`` (created) and return it."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    names = published_names(vision, TINY_TEXT)
    gen = torch.Generator().manual_seed(seed)
    tensors = {n: _random_tensor(n, s, gen).to(torch.bfloat16) for n, s in sorted(names.items())}
    order, weight_map = sorted(tensors), {}
    for k in range(n_shards):
        shard = f"model-{k + 1:05d}-of-{n_shards:05d}.safetensors"
        part = order[k::n_shards]
        save_file({n: tensors[n].contiguous() for n in part}, str(directory / shard),
                  metadata={"format": "pt"})
        weight_map.update({n: shard for n in part})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    _json(directory / "model.safetensors.index.json",
          {"metadata": {"total_size": total}, "weight_map": weight_map})
    _json(directory / "config.json", {
        "arch_specifier": "no-align+fused-gelu-mlp",
        "architectures": ["OpenVLAForActionPrediction"],
        "hf_llm_id": "meta-llama/Llama-2-7b-hf", "image_resize_strategy": "resize-naive",
        "image_sizes": [224, 224], "llm_backbone_id": "llama2-7b-pure", "llm_max_length": 2048,
        "model_type": "openvla", "n_action_bins": 256, "output_projector_states": False,
        "pad_to_multiple_of": 64, "pad_token_id": PAD_ID,
        "text_config": {"model_type": "llama", "pad_token_id": PAD_ID, "torch_dtype": "bfloat16",
                        "vocab_size": VOCAB_SIZE, **TINY_TEXT},
        "timm_model_ids": ["vit_large_patch14_reg4_dinov2.lvd142m",
                           "vit_so400m_patch14_siglip_224"],
        "timm_override_act_layers": [None, None], "torch_dtype": "bfloat16",
        "transformers_version": "4.40.1", "use_fused_vision_backbone": True,
        "vision_backbone_id": "dinosiglip-vit-so-224px"})
    _json(directory / "dataset_statistics.json", STATS)
    _json(directory / "generation_config.json", {"bos_token_id": 1, "eos_token_id": 2,
                                                 "pad_token_id": PAD_ID})
    _json(directory / "preprocessor_config.json", {
        "image_processor_type": "PrismaticImageProcessor", "image_resize_strategy": "resize-naive",
        "input_sizes": [[3, 224, 224], [3, 224, 224]], "interpolations": ["bicubic", "bicubic"],
        "means": [list(v.mean) for v in vision], "stds": [list(v.std) for v in vision],
        "processor_class": "PrismaticProcessor", "use_fused_vision_backbone": True})
    _tokenizer_files(directory)
    return directory


def write_vision_specs(path, vision: tuple[ViTSpec, ViTSpec] = TINY_VISION) -> Path:
    """The tiny backbones as the ``--vision-specs`` / ``model.vision_specs`` JSON file.

    The tiny checkpoint's config.json names OpenVLA's real backbones (its key layout is the
    real one); this file gives their reduced sizes to a loader that runs in another process
    or a node, where ``OpenVLAOptions(vision=...)`` cannot be handed in.
    """
    from dataclasses import asdict

    path = Path(path)
    _json(path, [asdict(spec) for spec in vision])
    return path
