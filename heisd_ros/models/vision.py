"""The small VLA's vision encoder: two cameras, patchified at low resolution.

Each camera image is resized to ``image_size_px`` squared, cut into patches by a strided
convolution, given a learned position and camera embedding and passed through a few
transformer blocks; both cameras run as one batch. The patch tokens go through an MLP
projector into the language model's embedding space (as OpenVLA's Prismatic projector does);
the mean patch feature of each camera is the pooled feature the retrieval DB embeds.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from heisd_ros.models.small_vla_config import SmallVLAConfig

N_CAMERAS = 2
# Per-channel pixel normalisation; fixed constants (there is no pretrained backbone to match).
_PIXEL_MEAN, _PIXEL_STD = 0.5, 0.25


class TwoCameraEncoder(nn.Module):
    """Images of both cameras -> (patch tokens in LLM space, pooled per-camera features)."""

    def __init__(self, config: SmallVLAConfig):
        super().__init__()
        self.config = config
        d = config.vision_dim
        self.patch_embed = nn.Conv2d(3, d, kernel_size=config.patch_size_px,
                                     stride=config.patch_size_px)
        self.position = nn.Parameter(torch.zeros(1, config.patches_per_camera, d))
        self.camera = nn.Parameter(torch.zeros(N_CAMERAS, 1, d))
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(d, config.vision_heads, dim_feedforward=2 * d,
                                       dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(config.vision_layers))
        self.norm = nn.LayerNorm(d)
        self.projector = nn.Sequential(nn.Linear(d, config.hidden_size), nn.GELU(),
                                       nn.Linear(config.hidden_size, config.hidden_size))
        nn.init.normal_(self.position, std=0.02)
        nn.init.normal_(self.camera, std=0.02)

    def pixels(self, images: list[np.ndarray]) -> torch.Tensor:
        """(H, W, 3) uint8 images -> (n, 3, S, S) normalised float pixels on the module's device."""
        size = self.config.image_size_px
        device = self.position.device
        batch = []
        for image in images:
            x = torch.as_tensor(np.ascontiguousarray(image), device=device)
            x = x.permute(2, 0, 1)[None].float() / 255.0
            if x.shape[-2:] != (size, size):
                x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True,
                                  align_corners=False)
            batch.append(x)
        return (torch.cat(batch) - _PIXEL_MEAN) / _PIXEL_STD

    def forward(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(2, 3, S, S) pixels (primary, wrist) -> tokens (1, 2 * patches, H), pooled (2, D)."""
        x = self.patch_embed(pixels.to(self.position.dtype)).flatten(2).transpose(1, 2)
        x = x + self.position + self.camera
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        pooled = x.mean(dim=1)
        tokens = self.projector(x).reshape(1, -1, self.config.hidden_size)
        return tokens, pooled
