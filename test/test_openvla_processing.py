"""Image preprocessing, prompt, tokenizer and the vision trunks' maths on the tiny checkpoint.

The trunks are checked against a from-scratch functional ViT written from timm's
``VisionTransformer`` (fused qkv read as ``reshape(B, N, 3, heads, head_dim)``, LayerScale,
exact GELU, position embedding on patches only, output of block depth - 2 without the prefix
tokens), fed the checkpoint tensors directly; ``test_openvla_timm`` compares with timm itself.
"""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from heisd_ros.models.openvla.config import OpenVLAOptions
from heisd_ros.models.openvla.loader import load_openvla
from heisd_ros.models.openvla.processor import center_crop_resize, pixel_values, resize_bicubic
from heisd_ros.models.openvla.prompt import OpenVLAPrompt
from heisd_ros.models.openvla.vit import IMAGENET_MEAN, IMAGENET_STD
from test.openvla_fixtures import TINY_VISION, write_tiny_openvla


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_tiny_openvla(tmp_path_factory.mktemp("tiny_openvla"))


@pytest.fixture(scope="module")
def target(checkpoint):
    return load_openvla(checkpoint, OpenVLAOptions(vision=TINY_VISION, unnorm_key="bridge_orig",
                                                   attn_implementation="eager"))


def test_pixels_are_normalised_per_backbone():
    gray = np.full((50, 70, 3), 128, dtype=np.uint8)
    pixels = pixel_values([gray], TINY_VISION, 224)
    assert pixels.shape == (1, 6, 224, 224) and pixels.dtype == torch.float32
    level = 128 / 255
    for c in range(3):
        expected = (level - IMAGENET_MEAN[c]) / IMAGENET_STD[c]
        assert pixels[0, c].sub(expected).abs().max() < 1e-5
    assert pixels[0, 3:].sub((level - 0.5) / 0.5).abs().max() < 1e-5


def test_resize_is_pil_bicubic_and_a_224_image_is_untouched():
    from PIL import Image

    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (120, 160, 3), dtype=np.uint8)
    ours = resize_bicubic(image, 224)
    assert np.array_equal(ours, np.asarray(Image.fromarray(image).resize((224, 224),
                                                                         Image.BICUBIC)))
    square = rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)
    assert np.array_equal(resize_bicubic(square, 224), square)


def test_center_crop_keeps_the_central_area_fraction():
    # A horizontal ramp (value = 10 x column / 2): the crop spans sqrt(0.9) of the width,
    # centred, sampled on TensorFlow's grid (y1 * (H - 1) + i * (y2 - y1) * (H - 1) / 223).
    width = 52
    ramp = np.tile((np.arange(width) * 5).astype(np.uint8)[None, :, None], (40, 1, 3))
    out = center_crop_resize(ramp, 0.9, 224)
    assert out.shape == (224, 224, 3) and out.dtype == np.uint8
    side = np.sqrt(0.9)
    first, last = (1 - side) / 2 * (width - 1), (1 + side) / 2 * (width - 1)
    assert abs(out[0, 0, 0] - 5 * first) <= 1 and abs(out[0, -1, 0] - 5 * last) <= 1
    assert (np.diff(out[0, :, 0].astype(int)) >= 0).all()          # still a ramp
    assert (out == out[:1]).all()                                  # rows unchanged
    flat = np.full((30, 30, 3), 77, dtype=np.uint8)
    assert (center_crop_resize(flat, 0.9, 224) == 77).all()
    identity = np.random.default_rng(1).integers(0, 256, (224, 224, 3), dtype=np.uint8)
    assert np.array_equal(center_crop_resize(identity, 1.0, 224), identity)


# sha256[:16] of TensorFlow 2.21's output for OpenVLA's LIBERO crop (crop_and_resize of the
# central 0.9 area, convert_image_dtype there and back) of default_rng(seed).integers(0, 256,
# (h, w, 3), uint8). Regenerate with tensorflow: the same ops as OpenVLA's
# ``experiments/robot/openvla_utils.py::crop_and_resize`` with output (out, out).
TF_CROP_GOLDEN = {(2, 480, 640, 224): "63d6f508741c6dbf", (3, 40, 50, 12): "349bad2a626f5e34",
                  (4, 97, 61, 33): "cf592a191ed0def8"}


@pytest.mark.parametrize("case", sorted(TF_CROP_GOLDEN))
def test_center_crop_is_bit_exact_with_tensorflow(case):
    import hashlib

    seed, h, w, out = case
    image = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    ours = center_crop_resize(image, 0.9, out)
    assert hashlib.sha256(ours.tobytes()).hexdigest()[:16] == TF_CROP_GOLDEN[case]


def test_prompt_text_and_ids(target):
    text = OpenVLAPrompt.text("  Put the Bowl on the PLATE\n")
    assert text == "In: What action should the robot take to put the bowl on the plate?\nOut:"
    ids = target.prompt.ids("Put the bowl on the plate")
    assert ids[0] == target.prompt.tokenizer.bos_token_id == 1
    assert ids[-1] == 29871 and ids.count(29871) >= 1
    assert ids[-2] == target.prompt.tokenizer.convert_tokens_to_ids(":")
    with pytest.raises(ValueError, match="instruction"):
        target.prompt.ids("   ")


def test_tokenizer_loads_with_autotokenizer_offline_and_matches_tokenizer_json(checkpoint):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint), local_files_only=True)
    assert (tokenizer.vocab_size, len(tokenizer), tokenizer.pad_token_id) == (32000, 32001, 32000)
    assert tokenizer.convert_ids_to_tokens(29871) == "\u2581"
    text = OpenVLAPrompt.text("open the top drawer of the cabinet")
    raw = Tokenizer.from_file(str(checkpoint / "tokenizer.json")).encode(text).ids
    assert tokenizer(text).input_ids == raw
    assert tokenizer.decode(raw, skip_special_tokens=True) == text


def test_a_tokenizer_that_disagrees_with_tokenizer_json_is_refused(target, checkpoint, tmp_path):
    # transformers 5 may rebuild a Llama tokenizer's pipeline instead of running the file's;
    # the guard compares the loaded tokenizer with the file on a probe prompt.
    import shutil

    target.prompt.check_against_tokenizer_json(checkpoint)      # pristine: agrees
    copy = shutil.copytree(checkpoint, tmp_path / "ckpt")
    tok = json.loads((copy / "tokenizer.json").read_text())
    tok["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Lowercase"}, {"type": "Prepend", "prepend": "\u2581"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
    (copy / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ValueError, match="tokenizer.json gives"):
        target.prompt.check_against_tokenizer_json(copy)


def _reference_vit(t: dict, prefix: str, spec, pixels: torch.Tensor) -> torch.Tensor:
    """ViT forward with timm's semantics, written out with torch.nn.functional."""
    d, heads = spec.embed_dim, spec.num_heads
    x = F.conv2d(pixels, t[prefix + "patch_embed.proj.weight"], t[prefix + "patch_embed.proj.bias"],
                 stride=spec.patch_px).flatten(2).transpose(1, 2) + t[prefix + "pos_embed"]
    tokens = [t[prefix + k].expand(len(x), -1, -1) for k in ("cls_token", "reg_token")
              if prefix + k in t]
    x = torch.cat([*tokens, x], dim=1)
    for i in range(spec.depth - 1):
        b = f"{prefix}blocks.{i}."

        def ls(v, name, b=b):
            return v * t[b + name] if b + name in t else v

        h = F.layer_norm(x, (d,), t[b + "norm1.weight"], t[b + "norm1.bias"], eps=1e-6)
        qkv = F.linear(h, t[b + "attn.qkv.weight"], t[b + "attn.qkv.bias"])
        q, k, v = qkv.reshape(len(x), -1, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
        att = ((q @ k.transpose(-2, -1)) * (d // heads) ** -0.5).softmax(-1)
        h = (att @ v).transpose(1, 2).reshape(len(x), -1, d)
        x = x + ls(F.linear(h, t[b + "attn.proj.weight"], t[b + "attn.proj.bias"]),
                   "ls1.scale_factor")
        h = F.layer_norm(x, (d,), t[b + "norm2.weight"], t[b + "norm2.bias"], eps=1e-6)
        h = F.linear(F.gelu(F.linear(h, t[b + "mlp.fc1.weight"], t[b + "mlp.fc1.bias"])),
                     t[b + "mlp.fc2.weight"], t[b + "mlp.fc2.bias"])
        x = x + ls(h, "ls2.scale_factor")
    return x[:, spec.prefix_tokens:]


def test_trunks_and_projector_compute_prismatic_maths(checkpoint, target):
    from safetensors.torch import load_file

    tensors = {}
    for shard in checkpoint.glob("model-*.safetensors"):
        tensors.update({k: v.float() for k, v in load_file(str(shard)).items()})
    pixels = torch.randn(2, 6, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = target.net.vision_backbone(pixels)
        projected = target.net.projector(got)
    expected = torch.cat([
        _reference_vit(tensors, "vision_backbone.featurizer.", TINY_VISION[0], pixels[:, :3]),
        _reference_vit(tensors, "vision_backbone.fused_featurizer.", TINY_VISION[1], pixels[:, 3:]),
    ], dim=2)
    assert got.shape == (2, 256, 32 + 48)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    fc = [(tensors[f"projector.fc{i}.weight"], tensors[f"projector.fc{i}.bias"]) for i in (1, 2, 3)]
    reference = F.linear(F.gelu(F.linear(F.gelu(F.linear(expected, *fc[0])), *fc[1])), *fc[2])
    torch.testing.assert_close(projected, reference, atol=1e-4, rtol=1e-4)
