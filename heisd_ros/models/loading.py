"""Loading the target VLA: the shipped small VLA, a small-VLA checkpoint, or OpenVLA.

The node, heisd-eval/-replay/-record/-calibrate/-bench/-build-db/-train-drafter and the tools
all say which target they want with one :class:`TargetChoice` and load it here, so a run
names its weights the same way everywhere: ``"<path> (sha256 <16 hex>)"``.

OpenVLA on a CPU: a 7B OpenVLA takes seconds per action on a CPU, which is no control loop.
Front ends that close a loop (the policy node, heisd-eval, heisd-record) refuse an OpenVLA
target whose device is the CPU unless the user opts in (``model.allow_cpu`` / ``--allow-cpu``);
offline tools (bench, build-db, calibrate, replay, train-drafter) run it where asked. The rule
is keyed on the resolved device, not on the checkpoint's size, and is checked before any
weight is read: a small or reduced checkpoint is refused on a CPU just the same, so nothing is
ever guessed from a parameter count (tests opt in).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

#: Where the shipped small-VLA weights live.
DEFAULT_TARGET_PATH = Path(__file__).resolve().parent.parent / "assets" / "small_vla.safetensors"

#: Target models that can be loaded (the tools' ``--model``, the node's ``model.type``).
MODELS = ("small", "openvla")
#: Weight precisions of an OpenVLA target (None/"" = bfloat16 on CUDA, float32 on a CPU).
DTYPES = ("bfloat16", "float16", "float32")


@dataclass(frozen=True)
class TargetChoice:
    """Which target VLA to load and how (the same fields for every front end).

    Attributes:
        model: "small" (the small VLA) or "openvla" (an OpenVLA checkpoint directory).
        path: small VLA: its safetensors; None = the shipped weights, else a seeded random
            initialisation.
        checkpoint: OpenVLA: the local checkpoint directory (never fetched from a hub).
        unnorm_key: OpenVLA: the dataset of ``dataset_statistics.json`` whose statistics
            un-normalise actions ("<key>_no_noops" is tried too); None = the only one.
        device: OpenVLA: "cuda", "cuda:1", "cpu"; None = CUDA when available, else the CPU.
        dtype: OpenVLA: one of :data:`DTYPES`; None = bfloat16 on CUDA, float32 on a CPU.
        center_crop: OpenVLA: crop the central 90% of the image area first (checkpoints
            fine-tuned with random-crop augmentation, e.g. every OpenVLA LIBERO fine-tune).
        vision_specs: OpenVLA: a JSON file of backbone sizes for a checkpoint whose
            backbones are not the ones its ``timm_model_ids`` name (see
            ``heisd_ros.models.openvla.vit.read_vision_specs``); None = from config.json.
        allow_cpu: an OpenVLA target may run on the CPU (module docstring). Front ends that
            close a control loop set it from an explicit opt-in; the offline tools leave it
            True.
    """

    model: str = "small"
    path: str | None = None
    checkpoint: str | None = None
    unnorm_key: str | None = None
    device: str | None = None
    dtype: str | None = None
    center_crop: bool = False
    vision_specs: str | None = None
    allow_cpu: bool = True

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"model: expected one of {MODELS}, got {self.model!r}")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {DTYPES} (or none: by device), got "
                             f"{self.dtype!r}")
        if self.model == "openvla":
            if not self.checkpoint:
                raise ValueError("model openvla needs a checkpoint directory (--checkpoint "
                                 "DIR, node: model.checkpoint), a local OpenVLA checkpoint")
            if self.path:
                raise ValueError(f"path: {self.path!r} is a small-VLA file (--target, "
                                 "model.path), but the model is openvla; its weights are the "
                                 "checkpoint directory")
            return
        extra = [name for name in ("checkpoint", "unnorm_key", "device", "dtype", "vision_specs")
                 if getattr(self, name)] + (["center_crop"] if self.center_crop else [])
        if extra:
            raise ValueError(f"{', '.join(extra)}: OpenVLA options, but the model is the small "
                             "VLA (choose --model openvla / model.type: openvla)")

    @classmethod
    def from_args(cls, args, closed_loop: bool = False) -> TargetChoice:
        """The choice of a tool's options (``tools._common.add_model_arguments``).

        ``closed_loop``: the tool runs a control loop, so ``--allow-cpu`` decides (default:
        refuse); otherwise the CPU is allowed.
        """
        def get(name):
            return getattr(args, name, None) or None

        return cls(model=getattr(args, "model", None) or "small", path=get("target"),
                   checkpoint=get("checkpoint"), unnorm_key=get("unnorm_key"),
                   device=get("device"), dtype=get("dtype"),
                   center_crop=bool(getattr(args, "center_crop", False)),
                   vision_specs=get("vision_specs"),
                   allow_cpu=bool(getattr(args, "allow_cpu", False)) if closed_loop else True)

    def small_vla_file(self) -> Path | None:
        """The small-VLA file this choice loads (None: OpenVLA, or a random initialisation)."""
        if self.model != "small":
            return None
        if self.path:
            return Path(self.path)
        return DEFAULT_TARGET_PATH if DEFAULT_TARGET_PATH.is_file() else None


def check_device_allowed(choice: TargetChoice, opt_in: str = "--allow-cpu") -> None:
    """Refuse an OpenVLA target on the CPU without the opt-in (module docstring).

    Cheap: only the device is resolved (no weights are read). ``opt_in`` names the switch
    in the message (``--allow-cpu``, ``model.allow_cpu: true``).

    Raises:
        ValueError: the target would run on the CPU and ``choice.allow_cpu`` is False.
    """
    if choice.model != "openvla" or choice.allow_cpu:
        return
    import torch

    if choice.device:
        device = torch.device(choice.device)
        why = f"device {choice.device!r} was asked for"
    else:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        why = "no CUDA device is available (torch.cuda.is_available() is False)"
    if device.type == "cpu":
        raise ValueError(f"OpenVLA on the CPU refused: {why}. A 7B OpenVLA takes seconds per "
                         f"action on a CPU, which is no control loop; run it on a CUDA GPU "
                         f"(a CUDA build of torch, device cuda), or opt in with {opt_in} for a "
                         f"debugging run")


def load_choice(choice: TargetChoice, seed: int = 0,
                gripper_switch_prob: str | float | None = None,
                openvla_options: dict | None = None, opt_in: str = "--allow-cpu"):
    """(target, description) of ``choice``.

    Small VLA: ``choice.path``, else the shipped weights if present, else a seeded random
    initialisation of the default config. OpenVLA: the checkpoint directory, CUDA bf16 when a
    GPU is present, else CPU fp32 (refused without ``allow_cpu``, see
    :func:`check_device_allowed`), never from a hub; ``openvla_options`` are further
    ``OpenVLAOptions`` fields (e.g. backbone specs in tests). ``gripper_switch_prob``
    overrides the target's gripper decision rule (a probability, or "none" for plain greedy;
    None keeps the checkpoint's, see ``TargetVLA.greedy_bins``); the description names the
    rule in force.
    """
    check_device_allowed(choice, opt_in)
    if choice.model == "openvla":
        from heisd_ros.models.openvla.loader import load_target as load_openvla

        options = {"center_crop": choice.center_crop, "dtype": choice.dtype,
                   **(openvla_options or {})}
        if choice.unnorm_key:
            options["unnorm_key"] = choice.unnorm_key
        if choice.vision_specs:
            from heisd_ros.models.openvla.vit import read_vision_specs

            options["vision"] = read_vision_specs(choice.vision_specs)
        target = load_openvla("openvla", Path(choice.checkpoint), device=choice.device,
                              **options)
        description = target.describe()
    else:
        target, description = _load_small(choice.path, seed)
    if gripper_switch_prob is not None:
        from heisd_ros.models.checkpoint import check_gripper_switch_probability

        target.gripper_switch_probability = check_gripper_switch_probability(
            gripper_switch_prob, "--gripper-switch-prob")
    if target.gripper_switch_probability is not None:
        description += f", gripper switches at P >= {target.gripper_switch_probability:g}"
    return target, description


def load_target(path: str | None, seed: int = 0, model: str = "small",
                checkpoint: str | None = None, unnorm_key: str | None = None,
                openvla_options: dict | None = None,
                gripper_switch_prob: str | float | None = None):
    """(target, description): :func:`load_choice` of a :class:`TargetChoice` of these fields.

    ``path`` is the small VLA's file (ignored with ``model="openvla"``).
    """
    choice = TargetChoice(model=model, path=path if model == "small" else None,
                          checkpoint=checkpoint, unnorm_key=unnorm_key)
    return load_choice(choice, seed, gripper_switch_prob, openvla_options)


def _load_small(path, seed):
    """The small VLA of ``path`` / the shipped weights / a random init, and its description."""
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
