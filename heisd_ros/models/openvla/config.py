"""What an OpenVLA checkpoint's ``config.json`` says, and how the user wants it run.

``config.json`` (written by transformers 4.40.1 from OpenVLA's ``OpenVLAConfig``) names the
two timm backbones, the image sizes and a *partial* ``text_config``: 4.40.1 saved only the
fields that differ from ``LlamaConfig()``'s defaults (for OpenVLA-7B just ``vocab_size``
32064 and ``pad_token_id`` 32000). The missing fields are filled from those 4.40.1 defaults
(Llama-2-7B's sizes) written out below, not from whatever the installed transformers uses.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from heisd_ros.models.openvla.vit import OPENVLA_VITS, ViTSpec

#: ``LlamaConfig()`` defaults of transformers 4.40.1 = Llama-2-7B (what a partial
#: ``text_config`` is relative to).
LLAMA_DEFAULTS_4_40 = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": None,
    "hidden_act": "silu", "max_position_embeddings": 2048, "initializer_range": 0.02,
    "rms_norm_eps": 1e-6, "use_cache": True, "pad_token_id": None, "bos_token_id": 1,
    "eos_token_id": 2, "pretraining_tp": 1, "tie_word_embeddings": False,
    "rope_theta": 10000.0, "rope_scaling": None, "attention_bias": False,
    "attention_dropout": 0.0,
}
_METADATA_KEYS = {"model_type", "torch_dtype", "dtype", "_name_or_path", "architectures",
                  "transformers_version"}
FUSED_PROJECTOR = "fused-gelu-mlp"
ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")
DTYPES = ("bfloat16", "float16", "float32")


@dataclass(frozen=True)
class PrismaticSpec:
    """The architecture of one OpenVLA checkpoint (from its ``config.json``).

    Attributes:
        vision: (DINOv2 spec, SigLIP spec), in the checkpoint's order.
        image_size_px: side of the square image both backbones see.
        text_config: complete ``LlamaConfig`` keyword arguments.
        pad_to_multiple_of: rows added to the tokenizer's vocabulary (action ids end there).
        n_action_bins: action bins (OpenVLA: 256).
    """

    vision: tuple[ViTSpec, ViTSpec]
    image_size_px: int
    text_config: dict
    pad_to_multiple_of: int = 64
    n_action_bins: int = 256

    @property
    def vocab_size(self) -> int:
        """Rows of the embedding table and the lm_head (OpenVLA-7B: 32064)."""
        return int(self.text_config["vocab_size"])

    @property
    def vocab_base(self) -> int:
        """Id just past the action ids: ``vocab_size - pad_to_multiple_of`` (32000)."""
        return self.vocab_size - self.pad_to_multiple_of

    @property
    def hidden_size(self) -> int:
        """Width of the language model (OpenVLA-7B: 4096)."""
        return int(self.text_config["hidden_size"])

    @property
    def vision_dim(self) -> int:
        """Concatenated patch feature width (OpenVLA: 1024 + 1152 = 2176)."""
        return sum(v.embed_dim for v in self.vision)

    @property
    def patches_per_image(self) -> int:
        """Vision tokens per image (224 / 14 squared = 256)."""
        return (self.image_size_px // self.vision[0].patch_px) ** 2

    def llama_config(self, attn_implementation: str = "sdpa"):
        """The ``transformers.LlamaConfig`` of the language model."""
        from transformers import LlamaConfig

        return LlamaConfig(**self.text_config, attn_implementation=attn_implementation)


def _fail(path: Path, message: str) -> ValueError:
    return ValueError(f"{path}: {message}")


def read_prismatic_config(directory: Path,
                          vision: tuple[ViTSpec, ViTSpec] | None = None) -> PrismaticSpec:
    """Parse and check ``directory/config.json``.

    Args:
        directory: the checkpoint directory.
        vision: backbone specs to use instead of the ones named by ``timm_model_ids`` (tiny
            stand-ins in tests); None = look the names up in :data:`OPENVLA_VITS`.
    """
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; an OpenVLA checkpoint directory has "
                                "config.json next to its safetensors shards")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise _fail(path, f"not valid JSON ({err})") from err
    if config.get("model_type", "openvla") != "openvla":
        raise _fail(path, f"model_type is {config.get('model_type')!r}, expected 'openvla'")
    if config.get("use_fused_vision_backbone") is not True:
        raise _fail(path, "use_fused_vision_backbone must be true (DINOv2 + SigLIP); got "
                    f"{config.get('use_fused_vision_backbone')!r}")
    if FUSED_PROJECTOR not in str(config.get("arch_specifier", FUSED_PROJECTOR)):
        raise _fail(path, f"arch_specifier {config.get('arch_specifier')!r} is not a "
                    f"'{FUSED_PROJECTOR}' projector")
    ids = list(config.get("timm_model_ids") or [])
    if vision is None:
        unknown = [i for i in ids if i not in OPENVLA_VITS]
        if len(ids) != 2 or unknown:
            raise _fail(path, f"timm_model_ids {ids} are not OpenVLA's backbones; supported: "
                        f"{sorted(OPENVLA_VITS)}")
        vision = (OPENVLA_VITS[ids[0]], OPENVLA_VITS[ids[1]])
    if [v.family for v in vision] != ["dinov2", "siglip"]:
        raise _fail(path, f"vision backbones must be (dinov2, siglip), got "
                    f"{[v.family for v in vision]}")
    act = config.get("timm_override_act_layers", [None, None])
    if any(a is not None for a in act):
        raise _fail(path, f"timm_override_act_layers {act} are not supported (expected nulls)")
    sizes = list(config.get("image_sizes") or [])
    if len(sizes) != 2 or sizes[0] != sizes[1] or not isinstance(sizes[0], int):
        raise _fail(path, f"image_sizes must be two equal ints, got {sizes}")
    if config.get("n_action_bins", 256) != 256:
        raise _fail(path, f"n_action_bins {config['n_action_bins']} is not 256")
    text = dict(config.get("text_config") or {})
    if text.get("model_type", "llama") != "llama":
        raise _fail(path, f"text_config.model_type {text['model_type']!r} is not 'llama'")
    merged = {**LLAMA_DEFAULTS_4_40,
              **{k: v for k, v in text.items() if k not in _METADATA_KEYS}}
    if merged.get("pad_token_id") is None:
        merged["pad_token_id"] = config.get("pad_token_id", 32000)
    spec = PrismaticSpec(vision=tuple(vision), image_size_px=sizes[0], text_config=merged,
                         pad_to_multiple_of=int(config.get("pad_to_multiple_of", 64)))
    if spec.vocab_base < spec.n_action_bins:
        raise _fail(path, f"vocabulary size {spec.vocab_size} minus pad_to_multiple_of "
                    f"{spec.pad_to_multiple_of} leaves no room for {spec.n_action_bins} "
                    "action ids")
    return spec


@dataclass(frozen=True)
class OpenVLAOptions:
    """How to run an OpenVLA checkpoint.

    Attributes:
        unnorm_key: dataset whose statistics un-normalise actions (a key of
            ``dataset_statistics.json``; "<key>_no_noops" is tried too); None = the only one.
        center_crop: crop the centre 90% of the image area first, as OpenVLA's LIBERO
            evaluation does for models fine-tuned with image augmentation.
        crop_area_fraction: area kept by the centre crop.
        embed_wrist: run the wrist camera through the vision backbone for the retrieval
            embedding (pooled patches of both cameras, 2 x 2176 = 4352-d). The target
            itself always sees only the primary (third-person) camera, as OpenVLA does.
        device: "cuda", "cuda:1", "cpu", ...; None = CUDA when available, else CPU.
        dtype: "bfloat16", "float16" or "float32"; None = bfloat16 on CUDA, float32 on CPU.
        attn_implementation: "sdpa" or "eager" (tree verification needs a 4D mask).
        gripper_open_is_one: the checkpoint's gripper output means 1 = open (Open-X data, as
            OpenVLA and its fine-tunes were trained); actions are converted to this project's
            0 = open / 1 = closed. False for a model trained on 1 = closed data.
        vision: backbone specs overriding ``timm_model_ids`` (tiny stand-ins in tests).
    """

    unnorm_key: str | None = None
    center_crop: bool = False
    crop_area_fraction: float = 0.9
    embed_wrist: bool = True
    device: str | None = None
    dtype: str | None = None
    attn_implementation: str = "sdpa"
    gripper_open_is_one: bool = True
    vision: tuple[ViTSpec, ViTSpec] | None = None

    def __post_init__(self) -> None:
        if self.unnorm_key is not None and (not isinstance(self.unnorm_key, str)
                                            or not self.unnorm_key):
            raise ValueError(f"unnorm_key: expected a dataset name or None, got "
                             f"{self.unnorm_key!r}")
        if not 0.0 < self.crop_area_fraction <= 1.0:
            raise ValueError(f"crop_area_fraction: expected a value in (0, 1], got "
                             f"{self.crop_area_fraction}")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {DTYPES} or None, got {self.dtype!r}")
        if self.attn_implementation not in ATTENTION_IMPLEMENTATIONS:
            raise ValueError(f"attn_implementation: expected one of {ATTENTION_IMPLEMENTATIONS}, "
                             f"got {self.attn_implementation!r}")
        if self.vision is not None and len(self.vision) != 2:
            raise ValueError(f"vision: expected (dinov2 spec, siglip spec), got {self.vision!r}")

    def resolve(self):
        """(torch.device, torch.dtype): CUDA bf16 when available, else CPU fp32."""
        import torch

        if self.device is None:
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        else:
            device = torch.device(self.device)
            if device.type == "cuda" and not torch.cuda.is_available():
                raise ValueError(f"device: {self.device!r} requested but CUDA is not available")
        name = self.dtype or ("bfloat16" if device.type == "cuda" else "float32")
        return device, getattr(torch, name)
