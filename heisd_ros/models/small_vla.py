r"""The small VLA that ships with the project: two-camera encoder + ``LlamaForCausalLM``.

Prompt layout (byte-level text), ``prompt_layout="vision_first"`` (OpenVLA's order):
    [bos] [primary patches] [wrist patches] [proprio token, if configured]
    "In: <instruction, lower case>\\nOut:"
or ``"instruction_first"``:
    [bos] "In: <instruction, lower case>\\nOut:" [pad ...] [primary patches] [wrist patches]
    [proprio token]
with the text padded to ``config.text_slot`` ids, so that the head (bos + text) is the same
for every step of an episode and its keys/values are reused (``Prefix.static_length``).
Either is followed by the 7 action tokens. A missing wrist camera is fed as a black image; a
missing proprioception vector as zeros.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from heisd_ros.data.observation import Observation
from heisd_ros.models.small_vla_config import SmallVLAConfig
from heisd_ros.models.target import Prefix, TargetVLA
from heisd_ros.models.vision import TwoCameraEncoder
from heisd_ros.models.vocab import BOS_ID, PAD_ID

PROMPT_TEMPLATE = "In: {instruction}\nOut:"


class SmallVLANet(nn.Module):
    """All weights of the small VLA (what a checkpoint stores)."""

    def __init__(self, config: SmallVLAConfig):
        super().__init__()
        from transformers import LlamaForCausalLM

        self.config = config
        self.vision = TwoCameraEncoder(config)
        self.proprio = ProprioEncoder(config) if config.proprio_dim else None
        self.llm = LlamaForCausalLM(config.llama_config())


def pose_features(proprio: torch.Tensor) -> torch.Tensor:
    """(..., 7) ``make_proprio`` vectors -> (..., 10) O(1) features.

    5 x position (m), sin and cos of roll/pitch/yaw (continuous across +-pi), 20 x gripper
    width (m).
    """
    angles = proprio[..., 3:6]
    return torch.cat([5.0 * proprio[..., :3], torch.sin(angles), torch.cos(angles),
                      20.0 * proprio[..., 6:7]], dim=-1)


class ProprioEncoder(nn.Module):
    """Proprioception vector -> one token in the LLM's embedding space (a two-layer MLP).

    With ``proprio_features="pose"`` the vector is read in the ``make_proprio`` layout and
    featurised by :func:`pose_features`, so that angles near +-pi (a gripper pointing down)
    are continuous and all inputs are O(1).
    """

    def __init__(self, config: SmallVLAConfig):
        super().__init__()
        self.pose = config.proprio_features == "pose"
        width = 10 if self.pose else config.proprio_dim
        self.mlp = nn.Sequential(nn.Linear(width, config.hidden_size), nn.GELU(),
                                 nn.Linear(config.hidden_size, config.hidden_size))

    def forward(self, proprio: torch.Tensor) -> torch.Tensor:
        """(..., proprio_dim) -> (..., hidden_size)."""
        x = proprio.to(self.mlp[0].weight.dtype)
        return self.mlp(pose_features(x) if self.pose else x)


class SmallVLA(TargetVLA):
    """The shipped target VLA (see the module docstring).

    Build with :meth:`random` or load with ``heisd_ros.models.checkpoint.load_small_vla``.
    """

    def __init__(self, net: SmallVLANet):
        self.net = net.eval()
        self.config = net.config
        self.vocab = net.config.vocab
        super().__init__(net.llm, self.vocab.actions)

    @classmethod
    def random(cls, config: SmallVLAConfig | None = None, seed: int = 0,
               lm_head_scale: float = 1.0) -> SmallVLA:
        """Seeded random weights.

        ``lm_head_scale`` > 1 sharpens the output distribution (a "peaked" random model whose
        greedy choices are far from ties).
        """
        config = config or SmallVLAConfig()
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            net = SmallVLANet(config)
        with torch.no_grad():
            net.llm.lm_head.weight.mul_(lm_head_scale)
        return cls(net)

    @property
    def instruction_first(self) -> bool:
        """True when the prompt's text comes before the vision tokens (module docstring)."""
        return self.config.prompt_layout == "instruction_first"

    def prompt_ids(self, instruction: str) -> list[int]:
        """Token ids of bos + the text part of the prompt (padded in ``instruction_first``)."""
        text = PROMPT_TEMPLATE.format(instruction=instruction.strip().lower()
                                      [: self.config.max_instruction_bytes])
        ids = self.vocab.encode_text(text, self.config.text_slot)
        if self.instruction_first:
            ids += [PAD_ID] * (self.config.text_slot - len(ids))
        return [BOS_ID] + ids

    @torch.no_grad()
    def encode(self, observation: Observation) -> Prefix:
        """Prefix embeddings and pooled vision features of ``observation`` (no autograd)."""
        return self.prefix(observation)

    def prefix(self, observation: Observation) -> Prefix:
        """:meth:`encode` with autograd enabled (for training the VLA end to end)."""
        wrist = observation.image_wrist
        if wrist is None:
            wrist = np.zeros_like(observation.image_primary)
        vision = self.net.vision
        tokens, pooled = vision(vision.pixels([observation.image_primary, wrist]),
                                vision.word_ids([observation.instruction]))
        ids = self.prompt_ids(observation.instruction)
        text = self.embed(ids)
        step = [tokens.to(text.dtype)]
        if self.net.proprio is not None:
            step.append(self.net.proprio(self._proprio(observation)).reshape(1, 1, -1))
        if self.instruction_first:
            return Prefix(embeds=torch.cat([text, *step], dim=1),
                          vision_features=pooled.float().cpu(), static_length=len(ids),
                          static_key=tuple(ids))
        return Prefix(embeds=torch.cat([text[:, :1], *step, text[:, 1:]], dim=1),
                      vision_features=pooled.float().cpu())

    def _proprio(self, observation: Observation) -> torch.Tensor:
        dim = self.config.proprio_dim
        if observation.proprio is None:
            return torch.zeros(dim, device=self.device)
        if observation.proprio.shape != (dim,):
            raise ValueError(f"proprio: the model expects {dim} values, got "
                             f"{observation.proprio.shape[0]}")
        return torch.as_tensor(observation.proprio, device=self.device, dtype=torch.float32)

    def with_instruction_film(self, width: int, seed: int = 0) -> SmallVLA:
        """A copy whose vision stem is conditioned on the instruction (``instruction_film``).

        Every existing weight is kept; the new FiLM module starts as identity, so the copy
        decodes exactly like this model until it is trained. Its other weights are drawn from
        ``seed`` (the global RNG is left untouched). Keeps ``action_stats`` and the gripper
        rule.
        """
        import dataclasses

        if self.config.instruction_film:
            raise ValueError(f"with_instruction_film: the model already has instruction FiLM "
                             f"(width {self.config.instruction_film})")
        config = dataclasses.replace(self.config, instruction_film=width)
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            net = SmallVLANet(config).to(next(self.net.parameters()).dtype)
        missing, unexpected = net.load_state_dict(self.net.state_dict(), strict=False)
        if unexpected or any(not key.startswith("vision.film.") for key in missing):
            raise ValueError(f"with_instruction_film: state dicts differ beyond the FiLM "
                             f"module (missing {missing}, unexpected {unexpected})")
        copy = SmallVLA(net)
        copy.action_stats = getattr(self, "action_stats", None)
        copy.gripper_switch_probability = self.gripper_switch_probability
        return copy

    def with_prompt_layout(self, layout: str) -> SmallVLA:
        """A copy with the same weights that lays its prompt out as ``layout``.

        The network is unchanged (the layout only orders the prompt), but a model trained in
        one layout decodes poorly in the other until it is fine-tuned in it. Keeps
        ``action_stats`` and the gripper rule.
        """
        import dataclasses

        config = dataclasses.replace(self.config, prompt_layout=layout)  # validates layout
        net = SmallVLANet(config).to(next(self.net.parameters()).dtype)
        net.load_state_dict(self.net.state_dict())
        copy = SmallVLA(net)
        copy.action_stats = getattr(self, "action_stats", None)
        copy.gripper_switch_probability = self.gripper_switch_probability
        return copy

    def to(self, device=None, dtype=None) -> SmallVLA:
        """Move/cast all weights; returns self."""
        self.net.to(device=device, dtype=dtype)
        return self
