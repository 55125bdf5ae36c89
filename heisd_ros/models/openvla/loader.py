"""Load an OpenVLA checkpoint directory into an :class:`OpenVLATarget`; the ``--model`` factory.

Order: cheap checks first (config.json, dataset statistics, tokenizer, preprocessor config,
tensor names and shapes from the shard headers), then the weights, read shard by shard
straight onto the target device and dtype into a model built on the meta device (a 7B model
is materialised once). No remote code, no hub: everything comes from ``checkpoint``.

Example::

    target = load_target("openvla", Path("~/ckpt/openvla-7b-finetuned-libero-spatial"),
                         unnorm_key="libero_spatial", center_crop=True)
    decoder = ActionDecoder(target, codec=target.codec)
"""

from __future__ import annotations

from pathlib import Path

from heisd_ros.models.openvla.config import OpenVLAOptions, read_prismatic_config
from heisd_ros.models.openvla.keymap import check_plan_covers, key_plan, map_state
from heisd_ros.models.openvla.processor import check_preprocessor_config
from heisd_ros.models.openvla.prompt import OpenVLAPrompt
from heisd_ros.models.openvla.shards import check_against_plan, index_checkpoint, read_tensors
from heisd_ros.models.openvla.statistics import load_action_stats

#: Model names ``load_target`` accepts (the small VLA is loaded by ``models.checkpoint``).
MODELS = ("openvla",)
_VOCAB_TENSORS = ("language_model.model.embed_tokens.weight", "language_model.lm_head.weight")


def build_meta_net(spec, attn_implementation: str):
    """An :class:`OpenVLANet` for ``spec`` on the meta device (no memory) and its shapes."""
    import torch

    from heisd_ros.models.openvla.net import OpenVLANet

    with torch.device("meta"):
        net = OpenVLANet(spec, attn_implementation)
    return net, {k: tuple(v.shape) for k, v in net.state_dict().items()}


def load_openvla(checkpoint, options: OpenVLAOptions | None = None):
    """Load ``checkpoint`` (a local directory) as an :class:`OpenVLATarget`.

    Raises:
        FileNotFoundError: the directory, config.json, dataset_statistics.json or a shard
            named by the index is missing.
        ValueError: anything in the directory that does not fit OpenVLA (names the file and
            the field, tensor or key).
    """
    from heisd_ros.models.openvla.adapter import OpenVLATarget

    options = options or OpenVLAOptions()
    directory = Path(checkpoint).expanduser()
    if not directory.is_dir():
        raise FileNotFoundError(f"checkpoint: {directory} is not a directory (expected a local "
                                "OpenVLA checkpoint with config.json and safetensors shards)")
    spec = read_prismatic_config(directory, options.vision)
    unnorm_key, stats = load_action_stats(directory, options.unnorm_key)
    prompt = OpenVLAPrompt.load(directory, spec.vocab_base, spec.llama_config())
    check_preprocessor_config(directory, spec.vision, spec.image_size_px)

    net, module_shapes = build_meta_net(spec, options.attn_implementation)
    plan = key_plan(spec, module_shapes)
    check_plan_covers(plan, module_shapes)
    locations, shapes = index_checkpoint(directory)
    check_against_plan(directory, shapes, plan, _VOCAB_TENSORS)

    device, dtype = options.resolve()
    tensors = read_tensors(locations, plan.targets, device, dtype)
    net.load_state_dict(map_state(plan, tensors), strict=True, assign=True)
    net.rebuild_buffers(device)
    net.requires_grad_(False)          # a frozen verifier; the draft head trains separately
    return OpenVLATarget(net, prompt, unnorm_key, stats, options, directory)


def load_target(model: str, checkpoint, device: str | None = None, **options):
    """Factory behind ``--model NAME --checkpoint DIR``.

    Args:
        model: one of :data:`MODELS`.
        checkpoint: the checkpoint directory.
        device: "cuda", "cpu", ... (None = CUDA bf16 when available, else CPU fp32).
        **options: further :class:`OpenVLAOptions` fields (unnorm_key, center_crop, ...).
    """
    if model not in MODELS:
        raise ValueError(f"model: expected one of {MODELS}, got {model!r}")
    if checkpoint is None:
        raise ValueError(f"checkpoint: --model {model} needs --checkpoint DIR")
    return load_openvla(checkpoint, OpenVLAOptions(device=device, **options))
