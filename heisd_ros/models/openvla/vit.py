"""The two ViT trunks of OpenVLA's fused vision backbone, as Prismatic runs them.

Prismatic creates ``timm`` VisionTransformers (``pretrained=False, num_classes=0,
img_size=224``) and replaces their forward with ``get_intermediate_layers(n={depth - 2})``:
patch embedding, position embedding added to the patches only (DINOv2 has
``no_embed_class=True``; SigLIP has no prefix tokens), ``[cls, registers, patches]``, blocks
0 .. depth - 2, prefix tokens dropped, no final norm. The last block, the final norm and
SigLIP's attention-pool head are in the checkpoint but never run, so they are not built here.

The blocks are ``transformers``' maintained DINOv2-with-registers and SigLIP encoder layers
(same maths as timm's ``Block``: pre-norm attention and MLP, LayerScale for DINOv2, exact GELU
for both, LayerNorm eps 1e-6); the embedding step is written here with timm's tensor shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

FAMILIES = ("dinov2", "siglip")
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
HALF, HALF_STD = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)


@dataclass(frozen=True)
class ViTSpec:
    """Architecture of one ViT trunk (timm naming in the checkpoint).

    Attributes:
        name: timm model id (or a test name for a tiny stand-in).
        family: "dinov2" (LayerScale, cls + register tokens) or "siglip" (no prefix tokens,
            attention-pool head in the checkpoint).
        embed_dim, depth, num_heads, mlp_dim: trunk sizes (depth counts all blocks, also the
            last one that is never run).
        patch_px: patch side in pixels.
        reg_tokens: register tokens (DINOv2 reg4: 4).
        class_token: whether a cls token is prepended.
        mean, std: per-channel pixel normalisation the backbone was trained with.
    """

    name: str
    family: str
    embed_dim: int
    depth: int
    num_heads: int
    mlp_dim: int
    patch_px: int = 14
    reg_tokens: int = 0
    class_token: bool = True
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"family: expected one of {FAMILIES}, got {self.family!r}")
        for field_name in ("embed_dim", "num_heads", "mlp_dim", "patch_px"):
            value = getattr(self, field_name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{field_name}: expected a positive int, got {value!r}")
        if not isinstance(self.depth, int) or self.depth < 2:
            raise ValueError(f"depth: expected an int >= 2 (features come from block depth - 2), "
                             f"got {self.depth!r}")
        if self.embed_dim % self.num_heads:
            raise ValueError(f"num_heads: {self.num_heads} does not divide embed_dim "
                             f"{self.embed_dim}")
        if self.family == "dinov2" and self.mlp_dim % self.embed_dim:
            raise ValueError(f"mlp_dim: DINOv2 MLPs are an integer multiple of embed_dim "
                             f"{self.embed_dim}, got {self.mlp_dim}")
        if self.family == "siglip" and (self.class_token or self.reg_tokens):
            raise ValueError(f"class_token/reg_tokens: SigLIP has no prefix tokens, got "
                             f"class_token={self.class_token}, reg_tokens={self.reg_tokens}")

    @property
    def prefix_tokens(self) -> int:
        """Tokens before the patches (cls + registers)."""
        return int(self.class_token) + self.reg_tokens

    @property
    def layer_scale(self) -> bool:
        """Whether blocks carry LayerScale (``ls1``/``ls2``)."""
        return self.family == "dinov2"

    @property
    def attn_pool(self) -> bool:
        """Whether the checkpoint holds an attention-pool head (never run)."""
        return self.family == "siglip"


#: The backbones of OpenVLA's ``dinosiglip-vit-so-224px`` (timm 0.9.10 model definitions).
OPENVLA_VITS: dict[str, ViTSpec] = {
    "vit_large_patch14_reg4_dinov2.lvd142m": ViTSpec(
        "vit_large_patch14_reg4_dinov2.lvd142m", "dinov2", embed_dim=1024, depth=24,
        num_heads=16, mlp_dim=4096, reg_tokens=4, class_token=True),
    # mlp_ratio 3.7362 -> int(1152 * 3.7362) = 4304 hidden units.
    "vit_so400m_patch14_siglip_224": ViTSpec(
        "vit_so400m_patch14_siglip_224", "siglip", embed_dim=1152, depth=27, num_heads=16,
        mlp_dim=4304, class_token=False, mean=HALF, std=HALF_STD),
}


def read_vision_specs(path) -> tuple[ViTSpec, ViTSpec]:
    """(DINOv2 spec, SigLIP spec) from a JSON file: a list of two objects of ViTSpec fields.

    For a checkpoint whose backbones are not the ones its ``timm_model_ids`` name in
    :data:`OPENVLA_VITS` (e.g. a reduced-size checkpoint in the OpenVLA layout); the loader
    then checks every tensor shape against these specs as usual. Example entry::

        {"name": "vit_small_reg4_dinov2", "family": "dinov2", "embed_dim": 384, "depth": 12,
         "num_heads": 6, "mlp_dim": 1536, "reg_tokens": 4, "class_token": true}

    Raises:
        FileNotFoundError: no such file. ValueError: not two valid specs (names the field).
    """
    import json
    from dataclasses import fields
    from pathlib import Path

    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"vision_specs: {path} is not a file")
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"vision_specs: {path} is not valid JSON ({err})") from err
    if not isinstance(entries, list) or len(entries) != 2 or not all(
            isinstance(e, dict) for e in entries):
        raise ValueError(f"vision_specs: {path} must hold a list of two backbone objects "
                         "(DINOv2, then SigLIP)")
    known = {f.name for f in fields(ViTSpec)}
    specs = []
    for entry in entries:
        unknown = sorted(set(entry) - known)
        if unknown:
            raise ValueError(f"vision_specs: {path}: unknown fields {unknown}; valid: "
                             f"{sorted(known)}")
        values = {k: tuple(v) if k in ("mean", "std") else v for k, v in entry.items()}
        try:
            specs.append(ViTSpec(**values))
        except TypeError as err:    # a required field missing
            raise ValueError(f"vision_specs: {path}: {err}") from err
        except ValueError as err:
            raise ValueError(f"vision_specs: {path}: {err}") from err
    return specs[0], specs[1]


def _block(spec: ViTSpec, attn_implementation: str) -> nn.Module:
    """One transformers encoder layer equivalent to timm's ``Block`` for ``spec``."""
    if spec.family == "dinov2":
        from transformers import Dinov2WithRegistersConfig
        from transformers.models.dinov2_with_registers.modeling_dinov2_with_registers import (
            Dinov2WithRegistersLayer,
        )

        config = Dinov2WithRegistersConfig(
            hidden_size=spec.embed_dim, num_attention_heads=spec.num_heads,
            mlp_ratio=spec.mlp_dim // spec.embed_dim, hidden_act="gelu", layer_norm_eps=1e-6,
            qkv_bias=True, layerscale_value=1.0, drop_path_rate=0.0,
            attn_implementation=attn_implementation)
        layer = Dinov2WithRegistersLayer(config)
    else:
        from transformers import SiglipVisionConfig
        from transformers.models.siglip.modeling_siglip import SiglipEncoderLayer

        # timm's SigLIP ViT uses its default nn.GELU (exact), not SigLIP's tanh approximation.
        config = SiglipVisionConfig(
            hidden_size=spec.embed_dim, num_attention_heads=spec.num_heads,
            intermediate_size=spec.mlp_dim, hidden_act="gelu", layer_norm_eps=1e-6,
            attention_dropout=0.0, attn_implementation=attn_implementation)
        layer = SiglipEncoderLayer(config)
    hidden = layer.mlp.fc1.out_features
    if hidden != spec.mlp_dim:
        raise ValueError(f"mlp_dim: {spec.name} needs {spec.mlp_dim} MLP units but the "
                         f"transformers layer built {hidden}")
    return layer


class ViTTrunk(nn.Module):
    """Pixels (B, 3, S, S) -> patch features (B, (S / patch)^2, D) of block depth - 2."""

    def __init__(self, spec: ViTSpec, image_size_px: int, attn_implementation: str = "sdpa"):
        super().__init__()
        if image_size_px % spec.patch_px:
            raise ValueError(f"image_size_px: {image_size_px} is not a multiple of "
                             f"{spec.name}'s patch of {spec.patch_px} px")
        self.spec = spec
        d, n_patches = spec.embed_dim, (image_size_px // spec.patch_px) ** 2
        self.patch_embed = nn.Conv2d(3, d, kernel_size=spec.patch_px, stride=spec.patch_px)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d)) if spec.class_token else None
        self.reg_token = (nn.Parameter(torch.zeros(1, spec.reg_tokens, d))
                          if spec.reg_tokens else None)
        self.pos_embed = nn.Parameter(torch.zeros(1, n_patches, d))
        # Only the blocks that run: 0 .. depth - 2.
        self.blocks = nn.ModuleList(_block(spec, attn_implementation)
                                    for _ in range(spec.depth - 1))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """(B, 3, S, S) normalised pixels -> (B, patches, D) features of block depth - 2."""
        x = self.patch_embed(pixels.to(self.pos_embed.dtype)).flatten(2).transpose(1, 2)
        x = x + self.pos_embed          # patches only (no_embed_class semantics)
        batch = x.shape[0]
        prefix = [t.expand(batch, -1, -1) for t in (self.cls_token, self.reg_token)
                  if t is not None]
        x = torch.cat([*prefix, x], dim=1)
        for block in self.blocks:
            x = block(x, None)
        return x[:, self.spec.prefix_tokens:]
