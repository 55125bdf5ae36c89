"""The small VLA's vision encoder: two cameras, patchified at low resolution.

Each camera image is resized to ``image_size_px`` squared, cut into patches by a strided
convolution (or, with ``stem_channels``, by a small coordinate-aware convolutional stem in
the spirit of CoordConv, Liu et al. 2018), given a learned position and camera embedding
and passed through a few transformer blocks; both cameras run as one batch. The patch
tokens go through an MLP projector into the language model's embedding space (as
OpenVLA's Prismatic projector does); the mean patch feature of each camera is the pooled
feature the retrieval DB embeds.
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
        if config.stem_channels:
            self.patch_embed = ConvStem(config.stem_channels, d, config.patch_size_px)
        else:
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

    def features(self, pixels: torch.Tensor) -> torch.Tensor:
        """(B, 2, 3, S, S) pixels -> (B * 2, patches, D) normalised patch features."""
        b, n_cam = pixels.shape[:2]
        x = self.patch_embed(pixels.flatten(0, 1).to(self.position.dtype))
        x = x.flatten(2).transpose(1, 2)                                      # (B*2, P, D)
        x = (x.reshape(b, n_cam, *x.shape[1:]) + self.position + self.camera).flatten(0, 1)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)

    def forward(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(2, 3, S, S) pixels (primary, wrist) -> tokens (1, 2 * patches, H), pooled (2, D)."""
        x = self.features(pixels[None])
        pooled = x.mean(dim=1)
        tokens = self.projector(x).reshape(1, -1, self.config.hidden_size)
        return tokens, pooled


class ConvStem(nn.Module):
    """(n, 3, S, S) pixels -> (n, D, S / p, S / p) features, p = ``patch_px``.

    Two coordinate channels (x, y in [-1, 1]) are appended to the pixels, so that the
    filters can encode where in the image a feature is. A 4x4 stride-4 patchify convolution
    (every pixel of a 4-pixel cell reaches the channels, so objects of a few pixels survive),
    a 3x3 stride-2 convolution, each with GroupNorm and GELU, then a (p / 8)-strided
    projection to D channels.
    """

    def __init__(self, channels: int, out_dim: int, patch_px: int):
        super().__init__()
        c = channels
        groups = max(1, min(8, c // 4))
        self.layers = nn.Sequential(
            nn.Conv2d(5, c, 4, stride=4), nn.GroupNorm(groups, c), nn.GELU(),
            nn.Conv2d(c, 2 * c, 3, stride=2, padding=1), nn.GroupNorm(groups, 2 * c), nn.GELU(),
            nn.Conv2d(2 * c, out_dim, kernel_size=patch_px // 8, stride=patch_px // 8))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """Append the coordinate channels and run the stem."""
        n, _, h, w = pixels.shape
        ys = torch.linspace(-1.0, 1.0, h, device=pixels.device, dtype=pixels.dtype)
        xs = torch.linspace(-1.0, 1.0, w, device=pixels.device, dtype=pixels.dtype)
        grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
        coords = torch.stack([grid_x, grid_y]).expand(n, 2, h, w)
        return self.layers(torch.cat([pixels, coords], dim=1))
