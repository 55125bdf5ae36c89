"""Cross-checks against timm itself (skipped where timm cannot be imported).

timm needs torchvision, and PyPI's torchvision does not import beside the CPU build of torch
that this project's venv uses, so these run on a GPU box (CUDA torch + torchvision + timm)
or in a side venv. They show that (1) the checkpoint naming the fixtures and the key map
assume is exactly what ``timm.create_model`` + Prismatic's LayerScale rename produce for the
two real backbones, and (2) the adapter's vision trunks compute what timm's
``get_intermediate_layers(n={depth - 2})`` computes, on tiny random ViTs of both families.
"""

import pytest
import torch

from heisd_ros.models.openvla.config import OpenVLAOptions
from heisd_ros.models.openvla.loader import load_openvla
from heisd_ros.models.openvla.vit import OPENVLA_VITS
from test.openvla_fixtures import TINY_VISION, timm_vit_names, write_tiny_openvla

timm = pytest.importorskip("timm", reason="timm (and a torchvision that imports) not installed")


def _prismatic_names(model) -> dict:
    """Names of a timm state dict as Prismatic saves them (LayerScale gamma -> scale_factor)."""
    return {k.replace(".gamma", ".scale_factor"): tuple(v.shape)
            for k, v in model.state_dict().items()}


@pytest.mark.parametrize("timm_id", sorted(OPENVLA_VITS))
def test_published_backbone_names_match_timm(timm_id):
    try:
        with torch.device("meta"):          # no memory
            model = timm.create_model(timm_id, pretrained=False, num_classes=0, img_size=224)
    except RuntimeError:                    # timm 0.9.x calls .item() while building
        model = timm.create_model(timm_id, pretrained=False, num_classes=0, img_size=224)
    assert _prismatic_names(model) == timm_vit_names(OPENVLA_VITS[timm_id])


def _tiny_timm(spec):
    from timm.models.vision_transformer import VisionTransformer

    common = dict(img_size=224, patch_size=spec.patch_px, embed_dim=spec.embed_dim,
                  depth=spec.depth, num_heads=spec.num_heads,
                  mlp_ratio=spec.mlp_dim / spec.embed_dim, num_classes=0)
    if spec.family == "dinov2":
        return VisionTransformer(**common, init_values=1e-5, reg_tokens=spec.reg_tokens,
                                 no_embed_class=True)
    return VisionTransformer(**common, class_token=False, global_pool="map")


def test_trunks_compute_timm_intermediate_layers(tmp_path):
    from safetensors.torch import load_file, save_file

    directory = write_tiny_openvla(tmp_path / "ckpt")
    torch.manual_seed(0)
    models = [_tiny_timm(spec).eval() for spec in TINY_VISION]
    for model in models:
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn_like(p) * 0.2)
    for model, spec in zip(models, TINY_VISION, strict=True):
        assert _prismatic_names(model) == timm_vit_names(spec)
    # Replace the fixture's vision tensors by timm's, shard by shard.
    ours = {f"vision_backbone.{name}.{k.replace('.gamma', '.scale_factor')}": v
            for name, m in zip(("featurizer", "fused_featurizer"), models, strict=True)
            for k, v in m.state_dict().items()}
    for shard in directory.glob("model-*.safetensors"):
        tensors = load_file(str(shard))
        tensors.update({k: ours[k].to(torch.bfloat16).contiguous() for k in tensors if k in ours})
        save_file(tensors, str(shard), metadata={"format": "pt"})
    target = load_openvla(directory, OpenVLAOptions(vision=TINY_VISION, unnorm_key="bridge_orig",
                                                    attn_implementation="eager"))
    for model in models:     # the checkpoint holds bf16; compare at the loaded precision
        model.to(torch.bfloat16).float()
    pixels = torch.randn(2, 3, 224, 224)
    trunks = (target.net.vision_backbone.featurizer, target.net.vision_backbone.fused_featurizer)
    for model, trunk in zip(models, trunks, strict=True):
        with torch.no_grad():
            expected = model.get_intermediate_layers(pixels, n={len(model.blocks) - 2})[0]
            got = trunk(pixels)
        assert got.shape == expected.shape == (2, 256, model.embed_dim)
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
