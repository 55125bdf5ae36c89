"""Camera image -> OpenVLA's 6-channel pixel values, as its processor and LIBERO eval do.

OpenVLA's ``PrismaticImageProcessor`` (``image_resize_strategy = "resize-naive"``) resizes
the PIL image to 224 x 224 with bicubic interpolation, scales to [0, 1] and normalises it
twice: ImageNet mean/std for DINOv2 (channels 0-2) and mean = std = 0.5 for SigLIP
(channels 3-5). Its LIBERO evaluation first (``center_crop=True``, for models fine-tuned with
random-crop augmentation) keeps the central 90% of the image *area* with TensorFlow's
``crop_and_resize`` (bilinear, output 224 x 224) and converts back to uint8; that step is
reproduced here in numpy with TensorFlow's sampling grid and rounding.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from heisd_ros.models.openvla.vit import ViTSpec

PREPROCESSOR_FILE = "preprocessor_config.json"
RESIZE_STRATEGY = "resize-naive"


def center_crop_resize(image: np.ndarray, area_fraction: float, out_px: int) -> np.ndarray:
    """Central crop of ``area_fraction`` of the area, resized to a square (uint8 in and out).

    The crop side is ``sqrt(area_fraction)`` of each image side; sampling is bilinear on
    ``tf.image.crop_and_resize``'s grid; (H, W, 3) -> (out_px, out_px, 3).
    """
    if out_px < 2:
        raise ValueError(f"out_px: expected >= 2 pixels, got {out_px}")
    h, w = image.shape[:2]
    side = np.float32(np.sqrt(np.float32(area_fraction)))
    lo = (np.float32(1) - side) / np.float32(2)
    hi = lo + side
    img = image.astype(np.float32) * np.float32(1.0 / 255.0)   # convert_image_dtype

    def grid(size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        # TF: in = y1 * (size - 1) + i * (y2 - y1) * (size - 1) / (out - 1)
        scale = (hi - lo) * np.float32(size - 1) / np.float32(out_px - 1)
        coord = lo * np.float32(size - 1) + np.arange(out_px, dtype=np.float32) * scale
        low = np.floor(coord).astype(np.int64)
        high = np.minimum(np.ceil(coord).astype(np.int64), size - 1)
        return low, high, (coord - low).astype(np.float32)

    y0, y1, fy = grid(h)
    x0, x1, fx = grid(w)
    fx = fx[None, :, None]
    top = img[y0][:, x0] + (img[y0][:, x1] - img[y0][:, x0]) * fx
    bottom = img[y1][:, x0] + (img[y1][:, x1] - img[y1][:, x0]) * fx
    out = np.clip(top + (bottom - top) * fy[:, None, None], 0.0, 1.0)
    # TF float -> uint8: multiply by 255.5, truncate, saturate.
    return np.minimum(out * np.float32(255.5), 255).astype(np.uint8)


def resize_bicubic(image: np.ndarray, size_px: int) -> np.ndarray:
    """Resize uint8 (H, W, 3) to (size_px, size_px, 3) with PIL's bicubic.

    This is what the processor's ``torchvision.transforms.functional.resize`` does to a PIL
    image.
    """
    from PIL import Image

    return np.asarray(Image.fromarray(image).resize((size_px, size_px), Image.BICUBIC))


def pixel_values(images: list[np.ndarray], vision: tuple[ViTSpec, ViTSpec], size_px: int,
                 center_crop: bool = False, crop_area_fraction: float = 0.9):
    """uint8 RGB images -> float32 tensor (n, 6, size_px, size_px) on the CPU."""
    import torch

    batch = []
    for image in images:
        rgb = np.ascontiguousarray(image, dtype=np.uint8)
        if center_crop:
            rgb = center_crop_resize(rgb, crop_area_fraction, size_px)
        unit = resize_bicubic(rgb, size_px).astype(np.float32) / np.float32(255.0)
        chw = np.transpose(unit, (2, 0, 1))
        parts = [(chw - np.asarray(v.mean, np.float32)[:, None, None])
                 / np.asarray(v.std, np.float32)[:, None, None] for v in vision]
        batch.append(np.concatenate(parts, axis=0))
    return torch.from_numpy(np.stack(batch).astype(np.float32))


def _matches(got, want) -> bool:
    if isinstance(want, str):
        return got == want
    try:
        return np.shape(got) == np.shape(want) and np.allclose(np.asarray(got, dtype=float),
                                                               np.asarray(want, dtype=float))
    except (TypeError, ValueError):      # strings among numbers, ragged lists
        return got == want


def check_preprocessor_config(directory: Path, vision: tuple[ViTSpec, ViTSpec],
                              size_px: int) -> None:
    """Check a checkpoint's ``preprocessor_config.json`` (if any) against this pipeline.

    Raises naming the first field that differs.
    """
    path = Path(directory) / PREPROCESSOR_FILE
    if not path.is_file():
        return
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from err
    expected = {
        "image_resize_strategy": RESIZE_STRATEGY,
        "input_sizes": [[3, size_px, size_px]] * 2,
        "interpolations": ["bicubic"] * 2,
        "means": [list(v.mean) for v in vision],
        "stds": [list(v.std) for v in vision],
    }
    for key, want in expected.items():
        if key not in config:
            continue
        got = config[key]
        if not _matches(got, want):
            raise ValueError(f"{path}: {key} is {got}, this adapter implements {want}")
