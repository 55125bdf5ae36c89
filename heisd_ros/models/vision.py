"""The small VLA's vision encoder: two cameras, patchified at low resolution.

Each camera image is resized to ``image_size_px`` squared, cut into patches by a strided
convolution (or, with ``stem_channels``, by a small coordinate-aware convolutional stem in
the spirit of CoordConv, Liu et al. 2018), given a learned position and camera embedding
and passed through a few transformer blocks; both cameras run as one batch. The patch
tokens go through an MLP projector into the language model's embedding space (as
OpenVLA's Prismatic projector does); the mean patch feature of each camera is the pooled
feature the retrieval DB embeds.

With ``instruction_film`` the convolutional stem is also told what to look for: the words of
the instruction (hashed into buckets, averaged) give a per-channel scale and shift of the
stem's second stage (FiLM, Perez et al. 2018; RT-1 conditions its image encoder on the
instruction the same way). The subgoal pathway's encoder (``small_vla.SubgoalPathway``) is
built this way, so that it can find the object the instruction names; the shipped model's
main encoder has no FiLM. The FiLM output layer starts at zero (identity FiLM).
"""

from __future__ import annotations

import re
import zlib

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
        self.film = InstructionFiLM(config) if config.instruction_film else None
        nn.init.normal_(self.position, std=0.02)
        nn.init.normal_(self.camera, std=0.02)

    def word_ids(self, instructions: list[str]) -> torch.Tensor | None:
        """(B, W) word bucket ids of ``instructions`` for :meth:`features`; None without FiLM."""
        return None if self.film is None else self.film.word_ids(instructions)

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

    def features(self, pixels: torch.Tensor, words: torch.Tensor | None = None) -> torch.Tensor:
        """(B, 2, 3, S, S) pixels -> (B * 2, patches, D) normalised patch features.

        ``words``: (B, W) ids from :meth:`word_ids`; required with ``instruction_film``.
        """
        b, n_cam = pixels.shape[:2]
        flat = pixels.flatten(0, 1).to(self.position.dtype)
        if self.film is None:
            x = self.patch_embed(flat)
        else:
            if words is None or words.shape[0] != b:
                raise ValueError(f"features: this encoder is conditioned on the instruction; "
                                 f"expected word ids for {b} samples, got "
                                 f"{None if words is None else tuple(words.shape)}")
            scale, shift = (t.repeat_interleave(n_cam, dim=0) for t in self.film(words))
            x = self.patch_embed(flat, (scale.to(flat.dtype), shift.to(flat.dtype)))
        x = x.flatten(2).transpose(1, 2)                                      # (B*2, P, D)
        x = (x.reshape(b, n_cam, *x.shape[1:]) + self.position + self.camera).flatten(0, 1)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)

    def forward(self, pixels: torch.Tensor,
                words: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(2, 3, S, S) pixels (primary, wrist) -> tokens (1, 2 * patches, H), pooled (2, D).

        ``words``: (1, W) ids from :meth:`word_ids`; required with ``instruction_film``.
        """
        x = self.features(pixels[None], words)
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

    def forward(self, pixels: torch.Tensor,
                film: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Append the coordinate channels and run the stem.

        ``film``: (scale, shift), each (n, 2 * channels); the second stage's output x
        becomes x * (1 + scale) + shift before the projection.
        """
        n, _, h, w = pixels.shape
        ys = torch.linspace(-1.0, 1.0, h, device=pixels.device, dtype=pixels.dtype)
        xs = torch.linspace(-1.0, 1.0, w, device=pixels.device, dtype=pixels.dtype)
        grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
        coords = torch.stack([grid_x, grid_y]).expand(n, 2, h, w)
        x = torch.cat([pixels, coords], dim=1)
        if film is None:
            return self.layers(x)
        x = self.layers[:-1](x)
        scale, shift = film
        x = x * (1 + scale[:, :, None, None]) + shift[:, :, None, None]
        return self.layers[-1](x)


def instruction_words(text: str, buckets: int) -> list[int]:
    """Bucket ids of the words of ``text``: lower-case runs of [a-z0-9], CRC-32 modulo ``buckets``.

    CRC-32 (not Python's salted ``hash``) keeps the ids equal across processes and machines.
    """
    return [zlib.crc32(word.encode()) % buckets for word in re.findall(r"[a-z0-9]+", text.lower())]


class InstructionFiLM(nn.Module):
    """Instruction words -> (scale, shift) of the stem's second stage (see the module docstring).

    A bag of hashed words (mean of their embeddings; an unseen word lands in an untrained
    bucket) through a two-layer MLP. The output layer is zero-initialised: identity FiLM.
    """

    def __init__(self, config: SmallVLAConfig):
        super().__init__()
        width, self.buckets = config.instruction_film, config.instruction_buckets
        self.channels = 2 * config.stem_channels
        self.embed = nn.Embedding(self.buckets + 1, width, padding_idx=self.buckets)
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.GELU(),
                                 nn.Linear(width, 2 * self.channels))
        nn.init.zeros_(self.mlp[-1].weight)
        nn.init.zeros_(self.mlp[-1].bias)

    def word_ids(self, instructions: list[str]) -> torch.Tensor:
        """(B, W) bucket ids, right-padded with the padding id (W >= 1)."""
        rows = [instruction_words(text, self.buckets) for text in instructions]
        ids = torch.full((len(rows), max([1] + [len(r) for r in rows])), self.buckets,
                         dtype=torch.long, device=self.embed.weight.device)
        for i, row in enumerate(rows):
            ids[i, :len(row)] = torch.as_tensor(row, dtype=torch.long)
        return ids

    def forward(self, words: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, W) ids -> scale, shift, each (B, channels)."""
        mask = (words != self.buckets).unsqueeze(-1).to(self.embed.weight.dtype)
        bag = (self.embed(words) * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        return self.mlp(bag).split(self.channels, dim=-1)
