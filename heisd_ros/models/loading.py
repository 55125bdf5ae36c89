"""Loading the target VLA: the shipped small VLA, a small-VLA checkpoint, or OpenVLA.

The node, heisd-eval/-replay/-record/-bench and the tools all load their target here, so a
run names its weights the same way everywhere: ``"<path> (sha256 <16 hex>)"``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

#: Where the shipped small-VLA weights live.
DEFAULT_TARGET_PATH = Path(__file__).resolve().parent.parent / "assets" / "small_vla.safetensors"

#: Target models that can be loaded (the tools' ``--model``).
MODELS = ("small", "openvla")


def load_target(path: str | None, seed: int = 0, model: str = "small",
                checkpoint: str | None = None, unnorm_key: str | None = None,
                openvla_options: dict | None = None,
                gripper_switch_prob: str | float | None = None):
    """(target, description) of the VLA to use.

    ``model="small"``: from ``path``, else the shipped weights if present, else a seeded random
    initialisation of the default config. ``model="openvla"``: the OpenVLA checkpoint directory
    ``checkpoint`` (CUDA bf16 when a GPU is present, else CPU fp32), never from a hub;
    ``openvla_options`` are further ``OpenVLAOptions`` fields (e.g. backbone specs in tests).
    ``gripper_switch_prob`` overrides the target's gripper decision rule (a probability, or
    "none" for plain greedy; None keeps the checkpoint's, see ``TargetVLA.greedy_bins``); the
    description names the rule in force.
    """
    target, description = _load_target(path, seed, model, checkpoint, unnorm_key,
                                       openvla_options)
    if gripper_switch_prob is not None:
        from heisd_ros.models.checkpoint import check_gripper_switch_probability

        target.gripper_switch_probability = check_gripper_switch_probability(
            gripper_switch_prob, "--gripper-switch-prob")
    if target.gripper_switch_probability is not None:
        description += f", gripper switches at P >= {target.gripper_switch_probability:g}"
    return target, description


def _load_target(path, seed, model, checkpoint, unnorm_key, openvla_options):
    """:func:`load_target` without the gripper rule override."""
    if model not in MODELS:
        raise ValueError(f"model: expected one of {MODELS}, got {model!r}")
    if model == "openvla":
        if not checkpoint:
            raise ValueError("--model openvla needs --checkpoint DIR (a local checkpoint)")
        from heisd_ros.models.openvla.loader import load_target as load_openvla

        options = dict(openvla_options or {})
        if unnorm_key:
            options["unnorm_key"] = unnorm_key
        target = load_openvla("openvla", Path(checkpoint), **options)
        return target, f"OpenVLA {checkpoint} ({target.describe()})"
    from heisd_ros.models.checkpoint import load_small_vla
    from heisd_ros.models.small_vla import SmallVLA

    if path is None and DEFAULT_TARGET_PATH.is_file():
        path = str(DEFAULT_TARGET_PATH)
    if path is None:
        return SmallVLA.random(seed=seed), f"random-init small VLA (seed={seed})"
    return load_small_vla(path), f"{path} (sha256 {file_digest(path)})"


def file_digest(path) -> str:
    """First 16 hex digits of the file's sha256 (identifies the exact weights used)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()[:16]
