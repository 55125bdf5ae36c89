"""All modules of OpenVLA that run: fused vision backbone, projector, Llama-2 decoder.

Module names follow the checkpoint's top level (``vision_backbone.featurizer``,
``vision_backbone.fused_featurizer``, ``projector``, ``language_model``), so the key map
only renames inside the ViT blocks.
"""

from __future__ import annotations

import torch
from torch import nn

from heisd_ros.models.openvla.config import PrismaticSpec
from heisd_ros.models.openvla.vit import ViTTrunk


class FusedVisionBackbone(nn.Module):
    """6-channel pixels -> concatenated patch features (B, 256, D_dino + D_siglip)."""

    def __init__(self, spec: PrismaticSpec, attn_implementation: str):
        super().__init__()
        dino, siglip = spec.vision
        self.featurizer = ViTTrunk(dino, spec.image_size_px, attn_implementation)
        self.fused_featurizer = ViTTrunk(siglip, spec.image_size_px, attn_implementation)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """Pixels (B, 6, S, S): channels 0-2 normalised for DINOv2, 3-5 for SigLIP."""
        if pixels.ndim != 4 or pixels.shape[1] != 6:
            raise ValueError(f"pixels: expected (B, 6, S, S), got {tuple(pixels.shape)}")
        return torch.cat([self.featurizer(pixels[:, :3]),
                          self.fused_featurizer(pixels[:, 3:])], dim=2)


class FusedProjector(nn.Module):
    """Prismatic's ``fused-gelu-mlp``: D -> 4D -> H -> H with GELU (exact) between."""

    def __init__(self, vision_dim: int, llm_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(vision_dim, 4 * vision_dim)
        self.fc2 = nn.Linear(4 * vision_dim, llm_dim)
        self.fc3 = nn.Linear(llm_dim, llm_dim)
        self.act = nn.GELU()

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """(..., D) patch features -> (..., H) LLM input embeddings."""
        return self.fc3(self.act(self.fc2(self.act(self.fc1(patches)))))


class OpenVLANet(nn.Module):
    """The weights a checkpoint fills (see the module docstring).

    Build it under ``torch.device("meta")`` and load with ``assign=True`` so a 7B model is
    never materialised twice; :meth:`rebuild_buffers` then recreates the non-persistent
    buffers (rotary frequencies) that a checkpoint does not carry.
    """

    def __init__(self, spec: PrismaticSpec, attn_implementation: str = "sdpa"):
        super().__init__()
        from transformers import LlamaForCausalLM

        self.spec = spec
        self.vision_backbone = FusedVisionBackbone(spec, attn_implementation)
        self.projector = FusedProjector(spec.vision_dim, spec.hidden_size)
        self.language_model = LlamaForCausalLM(spec.llama_config(attn_implementation))

    def rebuild_buffers(self, device: torch.device) -> None:
        """Recreate buffers that are not in the checkpoint, then refuse any left on meta."""
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        llm = self.language_model.model
        llm.rotary_emb = LlamaRotaryEmbedding(self.language_model.config).to(device)  # fp32
        left = [name for name, t in [*self.named_parameters(), *self.named_buffers()]
                if t.is_meta]
        if left:
            raise RuntimeError(f"OpenVLANet: tensors not loaded from the checkpoint: {left[:5]}")
