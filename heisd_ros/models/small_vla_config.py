"""Configuration of the shipped small VLA (two-camera vision encoder + Llama decoder)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields

from heisd_ros.models.target import MASK_CAPABLE_ATTENTION
from heisd_ros.models.vocab import ByteVocab

PROPRIO_FEATURES = ("raw", "pose")
PROMPT_LAYOUTS = ("vision_first", "instruction_first")
POSE_PROPRIO_DIM = 7
_POSITIVE_INTS = ("image_size_px", "patch_size_px", "vision_dim", "vision_heads",
                  "hidden_size", "num_layers", "num_heads", "intermediate_size",
                  "instruction_buckets", "max_instruction_bytes", "max_position_embeddings")


@dataclass(frozen=True)
class SmallVLAConfig:
    """Sizes of the small VLA.

    The defaults (14.3 M parameters, ~29 MB in fp16) keep the cost profile of OpenVLA in
    proportion: a one-layer draft head has ~1/14 of the decoder's per-token FLOPs, and the
    vision encoder is ~1% of an AR action (``heisd-bench profile``).

    Attributes:
        image_size_px: each camera is resized to a square of this many pixels.
        patch_size_px: side of a vision patch; (image_size_px / patch_size_px)^2 tokens per camera.
        vision_dim, vision_layers, vision_heads: the per-camera patch transformer.
        hidden_size, num_layers, num_heads, intermediate_size: the Llama decoder.
        vocab_base, model_vocab_size: byte-vocabulary layout (see ``vocab.py``).
        proprio_dim: length of the proprioception vector fed as one token; 0 = none.
        proprio_features: "raw" feeds the vector through an MLP as is; "pose" expects the
            ``make_proprio`` layout (x, y, z m; roll, pitch, yaw rad; gripper width m) and
            feeds sin/cos of the angles, so that a yaw wrapping at +-pi is continuous.
        stem_channels: 0 = a linear patch embedding (ViT style); > 0 = a coordinate-aware
            convolutional stem of this width (4x4 stride-4 patchify, a stride-2 convolution,
            then a patch_size_px / 8 strided projection), which localises small objects far better
            at low resolution. patch_size_px must then be a multiple of 8.
        instruction_film: 0 = the vision encoder does not see the instruction; > 0 = the
            width of the instruction-word embedding whose FiLM scales and shifts the
            convolutional stem (``vision.py``; needs stem_channels).
        instruction_buckets: hash buckets of the instruction words (with instruction_film
            or subgoal_pathway).
        subgoal_pathway: 0 = none; > 0 = the FiLM width of a second, instruction-conditioned
            encoder of both cameras that predicts where the hand will be at the next two
            gripper changes (``models/subgoal.py``'s targets) and adds that prediction, embedded, to
            the last prompt token (``small_vla.SubgoalPathway``; needs stem_channels, and
            proprio_dim for the pose it reads).
        max_instruction_bytes: longer instructions are cut (UTF-8 bytes).
        max_position_embeddings: upper bound on prompt + action length.
        attn_implementation: "eager" or "sdpa" (must honour a 4D tree mask).
        prompt_layout: "vision_first" = OpenVLA's order, [bos] [vision] [proprio] [text];
            "instruction_first" = [bos] [text, padded to a fixed slot] [vision] [proprio], whose
            text part depends only on the instruction, so its keys/values are computed once
            per instruction and reused at every step (``Prefix.static_length``).
    """

    image_size_px: int = 64
    patch_size_px: int = 16
    vision_dim: int = 128
    vision_layers: int = 1
    vision_heads: int = 4
    hidden_size: int = 256
    num_layers: int = 16
    num_heads: int = 4
    intermediate_size: int = 768
    vocab_base: int = 515
    model_vocab_size: int = 576
    proprio_dim: int = 0
    proprio_features: str = "raw"
    stem_channels: int = 0
    instruction_film: int = 0
    instruction_buckets: int = 1024
    subgoal_pathway: int = 0
    max_instruction_bytes: int = 48
    max_position_embeddings: int = 256
    attn_implementation: str = "eager"
    prompt_layout: str = "vision_first"

    def __post_init__(self) -> None:
        for name in _POSITIVE_INTS:
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        if self.vision_layers < 0:
            raise ValueError(f"vision_layers: expected >= 0, got {self.vision_layers}")
        if self.proprio_dim < 0:
            raise ValueError(f"proprio_dim: expected >= 0, got {self.proprio_dim}")
        if self.proprio_features not in PROPRIO_FEATURES:
            raise ValueError(f"proprio_features: expected one of {PROPRIO_FEATURES}, got "
                             f"{self.proprio_features!r}")
        if self.proprio_features == "pose" and self.proprio_dim not in (0, POSE_PROPRIO_DIM):
            raise ValueError(f"proprio_features: 'pose' needs proprio_dim {POSE_PROPRIO_DIM} "
                             f"(x, y, z, roll, pitch, yaw, gripper), got {self.proprio_dim}")
        if not isinstance(self.stem_channels, int) or self.stem_channels < 0:
            raise ValueError(f"stem_channels: expected an int >= 0, got {self.stem_channels!r}")
        if not isinstance(self.instruction_film, int) or self.instruction_film < 0:
            raise ValueError(f"instruction_film: expected an int >= 0, got "
                             f"{self.instruction_film!r}")
        if self.instruction_film and not self.stem_channels:
            raise ValueError("instruction_film: FiLM modulates the convolutional stem; set "
                             "stem_channels > 0")
        if not isinstance(self.subgoal_pathway, int) or self.subgoal_pathway < 0:
            raise ValueError(f"subgoal_pathway: expected an int >= 0, got "
                             f"{self.subgoal_pathway!r}")
        if self.subgoal_pathway and not (self.stem_channels and self.proprio_dim):
            raise ValueError("subgoal_pathway: its encoder is a FiLM-conditioned convolutional "
                             "stem and its head reads the pose; set stem_channels > 0 and "
                             "proprio_dim > 0")
        if self.stem_channels and self.patch_size_px % 8:
            raise ValueError(f"patch_size_px: the convolutional stem needs a multiple of 8, "
                             f"got {self.patch_size_px}")
        if self.image_size_px % self.patch_size_px:
            raise ValueError(f"patch_size_px: {self.patch_size_px} does not divide "
                             f"image_size_px {self.image_size_px}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"num_heads: {self.num_heads} does not divide hidden_size "
                             f"{self.hidden_size}")
        if self.vision_dim % self.vision_heads:
            raise ValueError(f"vision_heads: {self.vision_heads} does not divide vision_dim "
                             f"{self.vision_dim}")
        if self.attn_implementation not in MASK_CAPABLE_ATTENTION:
            raise ValueError(f"attn_implementation: expected one of {MASK_CAPABLE_ATTENTION}, "
                             f"got {self.attn_implementation!r}")
        if self.prompt_layout not in PROMPT_LAYOUTS:
            raise ValueError(f"prompt_layout: expected one of {PROMPT_LAYOUTS}, got "
                             f"{self.prompt_layout!r}")
        ByteVocab(self.vocab_base, self.model_vocab_size)  # raises on a bad layout
        longest_prompt = 1 + 2 * self.patches_per_camera + 1 + self.max_instruction_bytes + 16
        if self.max_position_embeddings < longest_prompt + 8:
            raise ValueError(f"max_position_embeddings: {self.max_position_embeddings} is too "
                             f"small for a prompt of up to {longest_prompt} tokens + 7 actions")

    @property
    def patches_per_camera(self) -> int:
        """Vision tokens per camera."""
        return (self.image_size_px // self.patch_size_px) ** 2

    @property
    def text_slot(self) -> int:
        """Most text ids a prompt has (instruction cut to ``max_instruction_bytes`` + template).

        The ``instruction_first`` layout pads every prompt's text to this.
        """
        return self.max_instruction_bytes + 16

    @property
    def vocab(self) -> ByteVocab:
        """The byte vocabulary layout of this config."""
        return ByteVocab(self.vocab_base, self.model_vocab_size)

    def to_json(self) -> str:
        """The config as JSON (stored in the checkpoint metadata)."""
        return json.dumps(asdict(self), sort_keys=True)

    def identity_json(self) -> str:
        """The config as JSON without the fields that leave the network unchanged.

        Instruction FiLM off (``instruction_film == 0``) builds no FiLM layers, so neither it
        nor ``instruction_buckets`` is written then (unless a subgoal pathway uses the
        buckets); nor is a zero ``subgoal_pathway`` or the default ``prompt_layout``. The
        retrieval DB's model fingerprint hashes this, so a DB built before those fields existed
        still matches the same weights.
        """
        data = asdict(self)
        if not self.instruction_film:
            del data["instruction_film"]
            if not self.subgoal_pathway:
                del data["instruction_buckets"]
        if not self.subgoal_pathway:
            del data["subgoal_pathway"]
        if self.prompt_layout == PROMPT_LAYOUTS[0]:
            del data["prompt_layout"]
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SmallVLAConfig:
        """Config from :meth:`to_json` output; unknown fields are an error."""
        data = json.loads(text)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"config: unknown fields {unknown}")
        return cls(**data)

    def llama_config(self):
        """The ``transformers.LlamaConfig`` of the decoder."""
        from transformers import LlamaConfig

        return LlamaConfig(
            vocab_size=self.model_vocab_size, hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size, num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads, num_key_value_heads=self.num_heads,
            max_position_embeddings=self.max_position_embeddings,
            attn_implementation=self.attn_implementation,
            bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
