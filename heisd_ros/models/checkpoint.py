"""Safetensors checkpoints of the small VLA and the draft head, checked on load.

One file per model: the tensors plus string metadata (format tag, config JSON, vocabulary
layout). Loading never touches a model hub. Every problem a user can cause (missing file,
not a safetensors file, wrong format, missing/unexpected tensors, wrong shapes, a vocabulary
layout that is not ours) raises with a message naming the file and the problem.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

from heisd_ros.actions.normalization import ActionStats
from heisd_ros.models.small_vla import SmallVLA, SmallVLANet
from heisd_ros.models.small_vla_config import SmallVLAConfig

SMALL_VLA_FORMAT = "heisd-small-vla/1"
#: How action ids are laid out; a checkpoint stating anything else is rejected.
ACTION_ID_LAYOUT = "id = vocab_base - 1 - bin"
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def read_checkpoint(path, expected_format: str) -> tuple[dict, dict]:
    """(tensors, metadata) of a safetensors file whose metadata ``format`` is expected_format."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file, safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = dict(handle.metadata() or {})
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(f"{path}: not a readable safetensors file ({err})") from err
    found = metadata.get("format")
    if found != expected_format:
        raise ValueError(f"{path}: expected a '{expected_format}' checkpoint, metadata "
                         f"says format={found!r}")
    return tensors, metadata


def load_into(module: nn.Module, tensors: dict, path, dtype: torch.dtype = torch.float32) -> None:
    """Copy ``tensors`` into ``module``; names and shapes must match exactly."""
    expected = module.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{path}: tensors do not match the model: missing {missing[:5]}"
                         f"{' ...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}"
                         f"{' ...' if len(unexpected) > 5 else ''}")
    for name, value in expected.items():
        if tuple(tensors[name].shape) != tuple(value.shape):
            raise ValueError(f"{path}: tensor '{name}' has shape {tuple(tensors[name].shape)}, "
                             f"the config needs {tuple(value.shape)}")
    module.load_state_dict({k: v.to(dtype) for k, v in tensors.items()})


def save_small_vla(vla: SmallVLA, path, dtype: str = "float16", extra: dict | None = None) -> Path:
    """Write the small VLA to ``path`` (safetensors, fp16 by default to stay small)."""
    from safetensors.torch import save_file

    if dtype not in _DTYPES:
        raise ValueError(f"dtype: expected one of {sorted(_DTYPES)}, got {dtype!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu", _DTYPES[dtype]).contiguous()
               for k, v in vla.net.state_dict().items()}
    metadata = {"format": SMALL_VLA_FORMAT, "config": vla.config.to_json(),
                "vocab_base": str(vla.config.vocab_base), "action_ids": ACTION_ID_LAYOUT,
                **{k: str(v) for k, v in (extra or {}).items()}}
    save_file(tensors, str(path), metadata=metadata)
    return path


def load_small_vla(path, device: str = "cpu", dtype: torch.dtype = torch.float32) -> SmallVLA:
    """Load a small VLA written by :func:`save_small_vla` (weights cast to ``dtype``).

    The action statistics stored with it (``extra={"action_stats": stats.to_json()}``) are
    set as ``vla.action_stats`` (None if absent); ``vla.codec`` decodes with them. A stored
    ``gripper_switch_probability`` sets the model's gripper decision rule
    (``TargetVLA.greedy_bins``).
    """
    tensors, metadata = read_checkpoint(path, SMALL_VLA_FORMAT)
    if metadata.get("action_ids") != ACTION_ID_LAYOUT:
        raise ValueError(f"{path}: vocabulary layout {metadata.get('action_ids')!r} is not "
                         f"'{ACTION_ID_LAYOUT}'")
    try:
        config = SmallVLAConfig.from_json(metadata["config"])
    except (KeyError, json.JSONDecodeError, TypeError) as err:
        raise ValueError(f"{path}: metadata has no valid 'config' ({err})") from err
    if metadata.get("vocab_base") != str(config.vocab_base):
        raise ValueError(f"{path}: vocabulary layout mismatch: metadata vocab_base="
                         f"{metadata.get('vocab_base')} but config vocab_base={config.vocab_base}")
    rows = tensors.get("llm.lm_head.weight")
    if rows is not None and rows.shape[0] != config.model_vocab_size:
        raise ValueError(f"{path}: vocabulary layout mismatch: lm_head has {rows.shape[0]} rows, "
                         f"the config's model_vocab_size is {config.model_vocab_size}")
    net = SmallVLANet(config)
    load_into(net, tensors, path, dtype)
    vla = SmallVLA(net).to(device=device, dtype=dtype)
    vla.action_stats = None
    if "action_stats" in metadata:
        try:
            vla.action_stats = ActionStats.from_json(metadata["action_stats"])
        except (KeyError, json.JSONDecodeError, TypeError, ValueError) as err:
            raise ValueError(f"{path}: metadata 'action_stats' is not valid ({err})") from err
    if "gripper_switch_probability" in metadata:
        vla.gripper_switch_probability = check_gripper_switch_probability(
            metadata["gripper_switch_probability"], f"{path}: metadata gripper_switch_probability")
    return vla


def set_gripper_switch_probability(path, value) -> Path:
    """Store (or, with None, remove) the gripper decision rule in a small-VLA checkpoint.

    Only the metadata changes: the tensors are written back bit for bit, so the model's
    fingerprint, its DBs and its draft head stay valid.
    """
    from safetensors.torch import save_file

    path = Path(path)
    value = check_gripper_switch_probability(value)
    tensors, metadata = read_checkpoint(path, SMALL_VLA_FORMAT)
    metadata.pop("gripper_switch_probability", None)
    if value is not None:
        metadata["gripper_switch_probability"] = repr(value)
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata=metadata)
    os.replace(tmp, path)
    return path


def check_gripper_switch_probability(value, what: str = "gripper_switch_probability"):
    """A gripper decision threshold in (0, 1), or None (plain greedy); raises ValueError."""
    if value is None or value in ("", "none", "None"):
        return None
    try:
        p = float(value)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{what}: expected a probability in (0, 1) or none, got {value!r}") \
            from err
    if not 0.0 < p < 1.0:
        raise ValueError(f"{what}: expected a probability in (0, 1) or none, got {value!r}")
    return p


DRAFT_HEAD_FORMAT = "heisd-draft-head/1"


def save_draft_head(head, path, target, extra: dict | None = None) -> Path:
    """Write a draft head (fp32) with the target's sizes, so a mismatch is caught on load."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in head.state_dict().items()}
    metadata = {"format": DRAFT_HEAD_FORMAT, "config": head.config.to_json(),
                "target_hidden_size": str(target.hidden_size),
                "vocab_base": str(target.actions.vocab_base),
                **{k: str(v) for k, v in (extra or {}).items()}}
    save_file(tensors, str(path), metadata=metadata)
    return path


def load_draft_head(path, target, device: str = "cpu"):
    """Load a draft head for ``target``; raises when it was made for another layout or size."""
    from heisd_ros.models.draft_head import DraftHead, DraftHeadConfig

    tensors, metadata = read_checkpoint(path, DRAFT_HEAD_FORMAT)
    try:
        config = DraftHeadConfig.from_json(metadata["config"])
    except (KeyError, json.JSONDecodeError, TypeError) as err:
        raise ValueError(f"{path}: metadata has no valid 'config' ({err})") from err
    if config.hidden_size != target.hidden_size:
        raise ValueError(f"{path}: draft head hidden_size {config.hidden_size} does not match "
                         f"the target's {target.hidden_size}")
    if metadata.get("vocab_base") != str(target.actions.vocab_base):
        raise ValueError(f"{path}: vocabulary layout mismatch: draft head vocab_base="
                         f"{metadata.get('vocab_base')}, target vocab_base="
                         f"{target.actions.vocab_base}")
    head = DraftHead(config)
    load_into(head, tensors, path)
    return head.to(device=device, dtype=target.language_model.dtype).eval()
