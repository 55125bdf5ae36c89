"""Checkpoint tensor names (timm / Prismatic naming) -> :class:`OpenVLANet` parameters.

The checkpoint stores each backbone as Prismatic saved its timm VisionTransformer, with
timm's LayerScale ``gamma`` renamed ``scale_factor`` (Prismatic patches it because
transformers 4.40 rewrote parameters named ``gamma`` on load). The blocks here are
transformers layers, so inside a block names change and the fused ``attn.qkv`` projection
(rows q, k, v, as timm's ``reshape(B, N, 3, heads, head_dim)`` reads them) is split in three.
Projector and language model keep their names.

Unused by design (OpenVLA runs ``get_intermediate_layers(n={depth - 2})``): each backbone's
last block and final ``norm``, and SigLIP's ``attn_pool`` head.
"""

from __future__ import annotations

from dataclasses import dataclass

from heisd_ros.models.openvla.config import PrismaticSpec
from heisd_ros.models.openvla.vit import ViTSpec

VISION_PREFIXES = ("vision_backbone.featurizer.", "vision_backbone.fused_featurizer.")
_QKV = ("q_proj", "k_proj", "v_proj")
# timm block suffix -> transformers layer suffix (a tuple: rows split q, k, v).
_DINOV2_BLOCK = {
    "norm1": "norm1", "attn.qkv": tuple(f"attention.{n}" for n in _QKV),
    "attn.proj": "attention.o_proj", "ls1.scale_factor": "layer_scale1.lambda1",
    "norm2": "norm2", "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2",
    "ls2.scale_factor": "layer_scale2.lambda1",
}
_SIGLIP_BLOCK = {
    "norm1": "layer_norm1", "attn.qkv": tuple(f"self_attn.{n}" for n in _QKV),
    "attn.proj": "self_attn.out_proj", "norm2": "layer_norm2", "mlp.fc1": "mlp.fc1",
    "mlp.fc2": "mlp.fc2",
}


@dataclass(frozen=True)
class KeyPlan:
    """Every tensor a checkpoint must hold, and where each goes.

    Attributes:
        shapes: checkpoint name -> expected shape (all tensors, used or not).
        targets: checkpoint name -> module parameter names (one: copied; three: the rows
            split evenly into q, k, v).
        unused: checkpoint names OpenVLA never runs (see the module docstring).
    """

    shapes: dict[str, tuple[int, ...]]
    targets: dict[str, tuple[str, ...]]
    unused: frozenset[str]


def _linear(out_dim: int, in_dim: int) -> dict[str, tuple[int, ...]]:
    return {"weight": (out_dim, in_dim), "bias": (out_dim,)}


def vit_checkpoint_shapes(spec: ViTSpec, image_size_px: int) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes of one timm ViT as Prismatic saves it (no prefix)."""
    d, m, p = spec.embed_dim, spec.mlp_dim, spec.patch_px
    shapes = {"patch_embed.proj.weight": (d, 3, p, p), "patch_embed.proj.bias": (d,),
              "pos_embed": (1, (image_size_px // p) ** 2, d)}
    if spec.class_token:
        shapes["cls_token"] = (1, 1, d)
    if spec.reg_tokens:
        shapes["reg_token"] = (1, spec.reg_tokens, d)
    block = {"norm1.weight": (d,), "norm1.bias": (d,), "norm2.weight": (d,), "norm2.bias": (d,),
             **{f"attn.qkv.{k}": s for k, s in _linear(3 * d, d).items()},
             **{f"attn.proj.{k}": s for k, s in _linear(d, d).items()},
             **{f"mlp.fc1.{k}": s for k, s in _linear(m, d).items()},
             **{f"mlp.fc2.{k}": s for k, s in _linear(d, m).items()}}
    if spec.layer_scale:
        block.update({"ls1.scale_factor": (d,), "ls2.scale_factor": (d,)})
    for i in range(spec.depth):
        shapes.update({f"blocks.{i}.{k}": s for k, s in block.items()})
    shapes.update({"norm.weight": (d,), "norm.bias": (d,)})
    if spec.attn_pool:  # timm AttentionPoolLatent(embed_dim, mlp_ratio of the trunk)
        shapes.update({"attn_pool.latent": (1, 1, d), "attn_pool.norm.weight": (d,),
                       "attn_pool.norm.bias": (d,)})
        for name, (o, i) in {"q": (d, d), "kv": (2 * d, d), "proj": (d, d),
                             "mlp.fc1": (m, d), "mlp.fc2": (d, m)}.items():
            shapes.update({f"attn_pool.{name}.{k}": s for k, s in _linear(o, i).items()})
    return shapes


def _vit_target(spec: ViTSpec, name: str) -> tuple[str, ...] | None:
    """Module names of checkpoint tensor ``name`` (no prefix), None when never run."""
    top = {"patch_embed.proj.weight": "patch_embed.weight",
           "patch_embed.proj.bias": "patch_embed.bias",
           "pos_embed": "pos_embed", "cls_token": "cls_token", "reg_token": "reg_token"}
    if name in top:
        return (top[name],)
    if not name.startswith("blocks."):
        return None                                   # final norm, attention pool
    _, index, rest = name.split(".", 2)
    if int(index) >= spec.depth - 1:
        return None                                   # the last block
    table = _DINOV2_BLOCK if spec.family == "dinov2" else _SIGLIP_BLOCK
    if rest in table:                                 # LayerScale: the tensor itself
        mapped, leaf = table[rest], ""
    else:                                             # a module's weight / bias
        stem, leaf = rest.rsplit(".", 1)
        mapped = table[stem]
    names = mapped if isinstance(mapped, tuple) else (mapped,)
    return tuple(f"blocks.{index}.{n}" + (f".{leaf}" if leaf else "") for n in names)


def key_plan(spec: PrismaticSpec, module_shapes: dict[str, tuple[int, ...]]) -> KeyPlan:
    """The plan for ``spec``.

    ``module_shapes`` (name -> shape of the built :class:`OpenVLANet`) supplies the projector
    and language-model tensors, whose checkpoint names equal the module's.
    """
    shapes, targets, unused = {}, {}, set()
    for prefix, vit in zip(VISION_PREFIXES, spec.vision, strict=True):
        for name, shape in vit_checkpoint_shapes(vit, spec.image_size_px).items():
            shapes[prefix + name] = shape
            target = _vit_target(vit, name)
            if target is None:
                unused.add(prefix + name)
            else:
                targets[prefix + name] = tuple(prefix + t for t in target)
    for name, shape in module_shapes.items():
        if name.startswith(("projector.", "language_model.")):
            shapes[name], targets[name] = tuple(shape), (name,)
    return KeyPlan(shapes=shapes, targets=targets, unused=frozenset(unused))


def check_plan_covers(plan: KeyPlan, module_shapes: dict[str, tuple[int, ...]]) -> None:
    """Raise unless the plan fills every module tensor exactly once with the right shape.

    This catches a transformers release that renamed layer internals.
    """
    filled: dict[str, tuple[int, ...]] = {}
    for source, names in plan.targets.items():
        rows = plan.shapes[source]
        for name in names:
            filled[name] = (rows[0] // len(names), *rows[1:])
    missing = sorted(set(module_shapes) - set(filled))
    extra = sorted(set(filled) - set(module_shapes))
    wrong = sorted(n for n in set(filled) & set(module_shapes)
                   if tuple(module_shapes[n]) != filled[n])
    if missing or extra or wrong:
        raise RuntimeError(f"key map out of date with the installed transformers: module tensors "
                           f"without a source {missing[:5]}, sources for unknown tensors "
                           f"{extra[:5]}, shape mismatches {wrong[:5]}")


def map_state(plan: KeyPlan, tensors: dict) -> dict:
    """Checkpoint tensors (name -> tensor) -> module state dict (unused tensors dropped)."""
    state = {}
    for source, names in plan.targets.items():
        value = tensors[source]
        for name, part in zip(names, value.chunk(len(names), dim=0), strict=True):
            state[name] = part.contiguous()
    return state
