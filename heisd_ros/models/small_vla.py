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
        self.subgoal = SubgoalPathway(config) if config.subgoal_pathway else None


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


class SubgoalPathway(nn.Module):
    """Cameras + instruction + pose -> predicted subgoals -> an addition to the prompt's end.

    The decoder of a small VLA trained by behaviour cloning alone does not bind the object
    word of its byte prompt to that object in the image (``training/subgoal.py``), while an
    encoder trained directly on where the hand goes next does (the assets README). This pathway
    hands the decoder that binding as an input:

    * ``encoder``: a second two-camera encoder of the main one's shape whose convolutional
      stem is conditioned on the instruction words (FiLM of width ``subgoal_pathway``);
    * ``head``: an MLP from its flattened patch features and the pose features to
      the targets of ``models/subgoal.py`` (the EE displacement to the next two gripper
      changes, in units of 0.1 m);
    * ``embed``: an MLP from that prediction to the LLM's embedding space, added to the last
      prompt token (the position whose hidden state predicts the first action token; the
      action tokens attend to it). Its output layer starts at zero, so adding the pathway to
      a trained model leaves its actions unchanged until the decoder is trained to read it.
      (Added to the proprio token instead, mid-prompt, the decoder hardly read it: runs
      p1/p2 in the assets README.)

    ``heisd-train-vla --subgoal-pathway`` trains it in two stages: encoder and head alone on
    the subgoal targets, then, with them fixed, ``embed`` on the actions (a hierarchical
    policy: where to go, then how to move there). With ``--train-only subgoal.embed.`` a
    trained decoder stays as it is and the embedding learns to steer it; fine-tuning the
    decoder with it cost the other suites (assets README).
    """

    def __init__(self, config: SmallVLAConfig):
        super().__init__()
        import dataclasses

        from heisd_ros.models.subgoal import N_TARGETS

        self.pose = config.proprio_features == "pose"
        self.encoder = TwoCameraEncoder(dataclasses.replace(
            config, instruction_film=config.subgoal_pathway, subgoal_pathway=0))
        self.encoder.projector = nn.Identity()  # only the patch features are read
        width = (2 * config.patches_per_camera * config.vision_dim
                 + (10 if self.pose else config.proprio_dim))
        self.head = nn.Sequential(nn.Linear(width, 256), nn.GELU(), nn.Linear(256, 256),
                                  nn.GELU(), nn.Linear(256, N_TARGETS))
        self.embed = nn.Sequential(nn.Linear(N_TARGETS, config.hidden_size), nn.GELU(),
                                   nn.Linear(config.hidden_size, config.hidden_size))
        nn.init.zeros_(self.embed[-1].weight)
        nn.init.zeros_(self.embed[-1].bias)

    def word_ids(self, instructions: list[str]) -> torch.Tensor:
        """(B, W) instruction word ids for :meth:`predict`."""
        return self.encoder.word_ids(instructions)

    def predict(self, pixels: torch.Tensor, words: torch.Tensor,
                proprio: torch.Tensor) -> torch.Tensor:
        """(B, 2, 3, S, S) normalised pixels, (B, W) word ids, (B, proprio_dim) -> (B, targets)."""
        features = self.encoder.features(pixels, words)
        b = proprio.shape[0]
        pose = proprio.float()
        pose = pose_features(pose) if self.pose else pose
        return self.head(torch.cat([features.reshape(b, -1).float(), pose], dim=-1))

    def forward(self, pixels: torch.Tensor, words: torch.Tensor,
                proprio: torch.Tensor) -> torch.Tensor:
        """The (B, hidden_size) addition to the last prompt token (see :meth:`predict`)."""
        subgoals = self.predict(pixels, words, proprio)
        return self.embed(subgoals.to(self.embed[0].weight.dtype))


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
        pixels = vision.pixels([observation.image_primary, wrist])
        tokens, pooled = vision(pixels, vision.word_ids([observation.instruction]))
        ids = self.prompt_ids(observation.instruction)
        text = self.embed(ids)
        step = [tokens.to(text.dtype)]
        if self.net.proprio is not None:
            proprio = self._proprio(observation)  # the pathway reads it too
            step.append(self.net.proprio(proprio).reshape(1, 1, -1))
        if self.instruction_first:
            embeds = torch.cat([text, *step], dim=1)
        else:
            embeds = torch.cat([text[:, :1], *step, text[:, 1:]], dim=1)
        pathway = self.net.subgoal
        if pathway is not None:
            # The pathway's prediction joins the last prompt token (the one whose hidden state
            # predicts the first action token), after the instruction-only head.
            extra = pathway(pixels[None], pathway.word_ids([observation.instruction]),
                            proprio[None]).to(embeds.dtype)  # a pathway implies proprio
            embeds = torch.cat([embeds[:, :-1], embeds[:, -1:] + extra[:, None]], dim=1)
        if self.instruction_first:
            return Prefix(embeds=embeds, vision_features=pooled.float().cpu(),
                          static_length=len(ids), static_key=tuple(ids))
        return Prefix(embeds=embeds, vision_features=pooled.float().cpu())

    def _proprio(self, observation: Observation) -> torch.Tensor:
        dim = self.config.proprio_dim
        if observation.proprio is None:
            return torch.zeros(dim, device=self.device)
        if observation.proprio.shape != (dim,):
            raise ValueError(f"proprio: the model expects {dim} values, got "
                             f"{observation.proprio.shape[0]}")
        return torch.as_tensor(observation.proprio, device=self.device, dtype=torch.float32)

    def with_subgoal_pathway(self, width: int, seed: int = 0) -> SmallVLA:
        """A copy with a :class:`SubgoalPathway` whose FiLM has width ``width``.

        Every existing weight is kept; the pathway's embedding starts at zero, so the copy
        decodes exactly like this model until it is trained. The pathway's encoder starts as
        a copy of the main encoder (its FiLM as identity); its other weights are drawn from
        ``seed`` (the global RNG is left untouched). Keeps ``action_stats`` and the
        gripper rule.
        """
        if self.config.subgoal_pathway:
            raise ValueError(f"with_subgoal_pathway: the model already has a subgoal pathway "
                             f"(width {self.config.subgoal_pathway})")
        copy = self._with_new_module("subgoal_pathway", width, "subgoal.", seed)
        # Warm start: the pathway's encoder begins as the main encoder (its FiLM as identity).
        main = {k: v for k, v in self.net.vision.state_dict().items()
                if not k.startswith(("projector.", "film."))}
        missing, unexpected = copy.net.subgoal.encoder.load_state_dict(main, strict=False)
        if unexpected or any(not key.startswith("film.") for key in missing):
            raise ValueError(f"with_subgoal_pathway: the encoders differ (missing {missing}, "
                             f"unexpected {unexpected})")
        return copy

    def _with_new_module(self, field: str, width: int, prefix: str, seed: int) -> SmallVLA:
        """A copy whose config sets ``field`` to ``width``; new weights only under ``prefix``."""
        import dataclasses

        config = dataclasses.replace(self.config, **{field: width})  # validates
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            net = SmallVLANet(config).to(next(self.net.parameters()).dtype)
        missing, unexpected = net.load_state_dict(self.net.state_dict(), strict=False)
        if unexpected or any(not key.startswith(prefix) for key in missing):
            raise ValueError(f"with_{field}: state dicts differ beyond the new module "
                             f"(missing {missing}, unexpected {unexpected})")
        copy = SmallVLA(net)
        copy.action_stats = getattr(self, "action_stats", None)
        copy.gripper_switch_probability = self.gripper_switch_probability
        return copy

    def to(self, device=None, dtype=None) -> SmallVLA:
        """Move/cast all weights; returns self."""
        self.net.to(device=device, dtype=dtype)
        return self
