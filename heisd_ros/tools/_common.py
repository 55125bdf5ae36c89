"""Helpers shared by the decoding tools (``heisd-train-drafter``, ``heisd-bench``)."""

from __future__ import annotations

import hashlib
from pathlib import Path

#: Where the shipped small-VLA weights live once trained (written by the simulator issue).
DEFAULT_TARGET_PATH = Path(__file__).resolve().parent.parent / "assets" / "small_vla.safetensors"


#: Target models the tools can load (``--model``).
MODELS = ("small", "openvla")


def add_model_arguments(parser) -> None:
    """``--model`` and ``--checkpoint`` (the target to load; see :func:`load_target`)."""
    parser.add_argument("--model", choices=MODELS, default="small",
                        help="target VLA: the shipped small VLA, or an OpenVLA checkpoint")
    parser.add_argument("--checkpoint", default=None,
                        help="OpenVLA: the local Hugging Face checkpoint directory")
    parser.add_argument("--unnorm-key", default=None,
                        help="OpenVLA: dataset statistics to un-normalise with")


def add_decoder_arguments(parser) -> None:
    """The options every tool that builds decoders by method name shares (eval, record, replay).

    ``--target``, ``--drafter``, ``--db``, ``--router-stats``, ``--calibration``,
    ``--gripper-switch-prob``, ``--retrieval-tree-nodes``: see ``heisd_ros.eval.methods``.
    """
    parser.add_argument("--target", default=None, help="small-VLA safetensors (default: shipped)")
    parser.add_argument("--drafter", default=None,
                        help="draft head safetensors (default: the shipped head with the "
                             "shipped small VLA; any other target gets an untrained head, "
                             "with a warning and drafter_untrained in the report)")
    parser.add_argument("--db", default=None,
                        help="embedded retrieval DB directory from heisd-build-db (hybrid methods)")
    parser.add_argument("--router-stats", default=None,
                        help="router statistics JSON (default: <db>/router_stats_<suite>.json)")
    parser.add_argument("--calibration", default=None, help="verify-skip calibration JSON")
    parser.add_argument("--gripper-switch-prob", default=None, metavar="P",
                        help="gripper decision rule of the target: change the gripper's state "
                             "when the other state's total probability reaches P in (0, 1); "
                             "'none' = plain greedy (default: what the checkpoint carries)")
    from heisd_ros.decoding.retrieval_tree import GroupTreeConfig

    parser.add_argument("--retrieval-tree-nodes", type=int, default=None, metavar="N",
                        help="node budget of the retrieval group tree verified in the prefill "
                             f"forward (hybrid methods; default {GroupTreeConfig().node_budget}). "
                             "On a CPU every node costs compute; on a GPU the forward is "
                             "memory-bound and nodes are cheap")


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


def load_target_from_args(args):
    """:func:`load_target` with a tool's ``--target``/``--model``/``--checkpoint`` options.

    A caller embedding a tool may set ``args.openvla_options`` (a dict) for options that have
    no command-line flag.
    """
    return load_target(getattr(args, "target", None), getattr(args, "seed", 0),
                       getattr(args, "model", "small"), getattr(args, "checkpoint", None),
                       getattr(args, "unnorm_key", None), getattr(args, "openvla_options", None))


def file_digest(path) -> str:
    """First 16 hex digits of the file's sha256 (identifies the exact weights used)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def int_vector(text: str, length: int, name: str) -> tuple[int, ...]:
    """Parse "a,b,c" (or a single value repeated) into ``length`` ints."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError as err:
        raise ValueError(f"{name}: expected comma-separated ints, got {text!r}") from err
    if len(values) == 1:
        values = values * length
    if len(values) != length:
        raise ValueError(f"{name}: expected {length} values, got {len(values)}")
    return tuple(values)


def set_threads(threads: int | None) -> None:
    """Limit torch's intra-op threads (the machine is shared; benches should say how many)."""
    if threads:
        import torch

        torch.set_num_threads(threads)
