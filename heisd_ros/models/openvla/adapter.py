"""OpenVLA as a :class:`~heisd_ros.models.target.TargetVLA`: observation -> prefix embeddings.

The target sees the primary (third-person) camera only, as OpenVLA does. With
``embed_wrist`` the wrist image runs through the same vision backbone in the same batch, and
its mean-pooled patch features join the primary's in ``Prefix.vision_features``
(2 x 2176 = 4352 values, the paper's retrieval embedding); a missing wrist image gives a row
of zeros so the embedding keeps its size.
"""

from __future__ import annotations

from pathlib import Path

import torch

from heisd_ros.actions.bins import ActionTokenMap
from heisd_ros.actions.normalization import ActionStats
from heisd_ros.data.observation import Observation
from heisd_ros.models.openvla.config import OpenVLAOptions
from heisd_ros.models.openvla.net import OpenVLANet
from heisd_ros.models.openvla.processor import pixel_values
from heisd_ros.models.openvla.prompt import OpenVLAPrompt
from heisd_ros.models.openvla.statistics import OpenVLACodec
from heisd_ros.models.target import Prefix, TargetVLA


class OpenVLATarget(TargetVLA):
    """OpenVLA behind the target interface.

    Build it with :func:`heisd_ros.models.openvla.loader.load_openvla`.

    Attributes:
        net: the loaded :class:`OpenVLANet` (eval mode).
        prompt: tokenizer + prompt template.
        codec: bins <-> physical actions with the checkpoint's dataset statistics and the
            project's gripper convention; pass it to ``ActionDecoder(target,
            codec=target.codec)`` and use it to encode demonstrations for the retrieval DB.
        unnorm_key: the dataset whose statistics ``codec`` uses.
        options: how the checkpoint is run.
        checkpoint: the directory it came from.
    """

    def __init__(self, net: OpenVLANet, prompt: OpenVLAPrompt, unnorm_key: str,
                 stats: ActionStats, options: OpenVLAOptions, checkpoint: Path):
        self.net = net.eval()
        self.spec = net.spec
        super().__init__(net.language_model, ActionTokenMap(vocab_base=self.spec.vocab_base))
        self.prompt = prompt
        self.codec = OpenVLACodec(stats, gripper_open_is_one=options.gripper_open_is_one)
        self.unnorm_key = unnorm_key
        self.options = options
        self.checkpoint = Path(checkpoint)

    @property
    def dtype(self) -> torch.dtype:
        """Precision of the weights (bf16 on CUDA, fp32 on CPU by default)."""
        return self.net.projector.fc1.weight.dtype

    @property
    def n_cameras(self) -> int:
        """Rows of ``Prefix.vision_features``: 2 with ``embed_wrist``, else 1."""
        return 2 if self.options.embed_wrist else 1

    def describe(self) -> str:
        """One line for logs and benchmark reports."""
        dtype = str(self.dtype).removeprefix("torch.")
        return (f"OpenVLA {self.checkpoint} (unnorm_key={self.unnorm_key}, {self.device}, "
                f"{dtype}, center_crop={self.options.center_crop})")

    @torch.no_grad()
    def encode(self, observation: Observation) -> Prefix:
        """[BOS, 256 projected patches of the primary camera, prompt] + pooled features."""
        images = [observation.image_primary]
        with_wrist = self.options.embed_wrist and observation.image_wrist is not None
        if with_wrist:
            images.append(observation.image_wrist)
        pixels = pixel_values(images, self.spec.vision, self.spec.image_size_px,
                              self.options.center_crop, self.options.crop_area_fraction)
        patches = self.net.vision_backbone(pixels.to(self.device, self.dtype))  # (n, 256, 2176)
        tokens = self.net.projector(patches[:1])                                # primary only
        text = self.embed(self.prompt.ids(observation.instruction))
        # Prismatic inserts the patches right after BOS.
        embeds = torch.cat([text[:, :1], tokens.to(text.dtype), text[:, 1:]], dim=1)
        pooled = patches.float().mean(dim=1)
        if self.options.embed_wrist and not with_wrist:
            pooled = torch.cat([pooled, torch.zeros_like(pooled)])
        return Prefix(embeds=embeds, vision_features=pooled.cpu())
