"""Image / CompressedImage <-> RGB conversion with cv_bridge's semantics (no node, no DDS)."""

from __future__ import annotations

import numpy as np
import pytest

from test.ros_env import require_ros

require_ros()

from sensor_msgs.msg import CompressedImage, Image  # noqa: E402

from heisd_ros.nodes.image_conversion import (  # noqa: E402
    ImageConversionError,
    compressed_to_rgb,
    image_to_rgb,
    rgb_to_compressed,
    rgb_to_image,
)


@pytest.fixture()
def rgb():
    """A (12, 10, 3) RGB image with distinct channels (smooth, so jpeg stays close)."""
    y, x = np.mgrid[0:12, 0:10]
    return np.stack([x * 20, y * 15, 255 - x * 10 - y * 5], axis=2).astype(np.uint8)


@pytest.mark.parametrize("encoding", ["rgb8", "bgr8"])
def test_colour_round_trip(rgb, encoding):
    msg = rgb_to_image(rgb, encoding)
    assert (msg.encoding, msg.height, msg.width, msg.step) == (encoding, 12, 10, 30)
    raw = np.frombuffer(bytes(msg.data), np.uint8).reshape(12, 10, 3)
    np.testing.assert_array_equal(raw, rgb if encoding == "rgb8" else rgb[:, :, ::-1])
    np.testing.assert_array_equal(image_to_rgb(msg), rgb)


def test_mono8_round_trip_is_grey(rgb):
    msg = rgb_to_image(rgb, "mono8")
    assert msg.step == 10
    out = image_to_rgb(msg)
    assert out.shape == (12, 10, 3)
    np.testing.assert_array_equal(out[:, :, 0], out[:, :, 2])
    luma = np.round(rgb @ np.array([0.299, 0.587, 0.114])).astype(np.uint8)
    np.testing.assert_array_equal(out[:, :, 1], luma)


@pytest.mark.parametrize("encoding,channels", [("rgb8", 3), ("bgr8", 3), ("mono8", 1)])
def test_step_padding_is_skipped(rgb, encoding, channels):
    pixels = {"rgb8": rgb, "bgr8": rgb[:, :, ::-1], "mono8": rgb[:, :, 1]}[encoding]
    rows = np.ascontiguousarray(pixels).reshape(12, 10 * channels)
    padded = np.concatenate([rows, np.full((12, 7), 0xAB, np.uint8)], axis=1)
    msg = Image(height=12, width=10, encoding=encoding, step=10 * channels + 7, is_bigendian=1)
    msg.data = padded.tobytes()  # 8-bit data: is_bigendian changes nothing
    out = image_to_rgb(msg)
    if channels == 3:
        np.testing.assert_array_equal(out, rgb)
    else:
        np.testing.assert_array_equal(out[:, :, 0], rgb[:, :, 1])
    assert out.flags.writeable


@pytest.mark.parametrize("encoding", ["rgba8", "bgra8", "16UC1", "mono16", "bayer_rggb8", ""])
def test_other_encodings_are_refused_by_name(encoding):
    msg = Image(height=2, width=2, encoding=encoding, step=8)
    msg.data = bytes(16)
    with pytest.raises(ImageConversionError, match=f"unsupported image encoding '{encoding}'"):
        image_to_rgb(msg)


def test_size_mismatches_are_refused(rgb):
    msg = rgb_to_image(rgb)
    msg.data = bytes(msg.data)[:-3]
    with pytest.raises(ImageConversionError, match="size mismatch"):
        image_to_rgb(msg)
    short = rgb_to_image(rgb)
    short.step = 20
    with pytest.raises(ImageConversionError, match="shorter than a row"):
        image_to_rgb(short)


@pytest.mark.parametrize("fmt", ["jpeg", "png", "rgb8; jpeg compressed bgr8",
                                 "bgr8; png compressed bgr8"])
def test_compressed_round_trip(rgb, fmt):
    msg = rgb_to_compressed(rgb, fmt)
    msg.format = fmt
    out = compressed_to_rgb(msg)
    assert out.shape == rgb.shape
    if "png" in fmt:
        np.testing.assert_array_equal(out, rgb)  # lossless
    else:
        assert np.abs(out.astype(int) - rgb.astype(int)).mean() < 6


def test_compressed_grey_png_becomes_rgb():
    import cv2

    grey = np.arange(64, dtype=np.uint8).reshape(8, 8)
    msg = CompressedImage(format="png")
    msg.data = cv2.imencode(".png", grey)[1].tobytes()
    out = compressed_to_rgb(msg)
    np.testing.assert_array_equal(out, np.repeat(grey[:, :, None], 3, axis=2))


def test_compressed_other_formats_and_corrupt_data_are_refused(rgb):
    msg = rgb_to_compressed(rgb, "png")
    msg.format = "tiff"
    with pytest.raises(ImageConversionError, match="unsupported compressed image format 'tiff'"):
        compressed_to_rgb(msg)
    broken = CompressedImage(format="jpeg")
    broken.data = b"not a jpeg"
    with pytest.raises(ImageConversionError, match="corrupt"):
        compressed_to_rgb(broken)
