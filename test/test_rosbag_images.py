"""Camera messages of bags: rosbag_io decodes them exactly as the policy node does.

Each case builds the rosbags message (through a CDR round trip, as replay reads it) and, when
rclpy's sensor_msgs is importable, the rclpy message from the same bytes: the pixels, or the
refusal message, must be the node's (``heisd_ros.nodes.image_conversion``). Without ROS the
numpy expectation is checked alone.
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from heisd_ros.data.rosbag_io import (
    CAMERA_FORMATS,
    COMPRESSED_IMAGE_TYPE,
    IMAGE_TYPE,
    TOPIC_THIRD_PERSON,
    TOPIC_TYPES,
    TOPIC_WRIST,
    ImageDecodeError,
    camera_msg,
    image_from_msg,
    make_typestore,
    topic_types,
)

try:  # the policy node's conversion needs rclpy's generated sensor_msgs
    from sensor_msgs.msg import CompressedImage as RclpyCompressedImage
    from sensor_msgs.msg import Image as RclpyImage

    from heisd_ros.nodes import image_conversion
except ImportError:
    image_conversion = None


@pytest.fixture(scope="module")
def ts():
    return make_typestore()


@pytest.fixture(scope="module")
def rgb():
    """A (12, 10, 3) RGB image with distinct, smooth channels (jpeg stays close)."""
    y, x = np.mgrid[0:12, 0:10]
    return np.stack([x * 20, y * 15, 255 - x * 10 - y * 5], axis=2).astype(np.uint8)


def _header(ts):
    return ts.types["std_msgs/msg/Header"](
        stamp=ts.types["builtin_interfaces/msg/Time"](sec=1, nanosec=2), frame_id="cam")


def _bag_image(ts, data: bytes, **fields):
    msg = ts.types[IMAGE_TYPE](header=_header(ts), data=np.frombuffer(data, np.uint8), **fields)
    return ts.deserialize_cdr(ts.serialize_cdr(msg, IMAGE_TYPE), IMAGE_TYPE)


def _bag_compressed(ts, data: bytes, fmt: str):
    msg = ts.types[COMPRESSED_IMAGE_TYPE](header=_header(ts), format=fmt,
                                          data=np.frombuffer(data, np.uint8))
    return ts.deserialize_cdr(ts.serialize_cdr(msg, COMPRESSED_IMAGE_TYPE),
                              COMPRESSED_IMAGE_TYPE)


def _node_image(data: bytes, **fields):
    """(rgb or None, error text or None) of the policy node's conversion; None without ROS."""
    if image_conversion is None:
        return None
    msg = RclpyImage(**fields)
    msg.data = data
    return _outcome(image_conversion.image_to_rgb, msg)


def _node_compressed(data: bytes, fmt: str):
    if image_conversion is None:
        return None
    msg = RclpyCompressedImage(format=fmt)
    msg.data = data
    return _outcome(image_conversion.compressed_to_rgb, msg)


def _outcome(convert, msg):
    try:
        return convert(msg), None
    except ValueError as err:
        return None, str(err)


def _assert_same_as_node(ours: np.ndarray, node) -> None:
    if node is not None:
        assert node[1] is None, node[1]
        np.testing.assert_array_equal(ours, node[0])


def _padded(pixels: np.ndarray, pad: int) -> bytes:
    rows = np.ascontiguousarray(pixels).reshape(pixels.shape[0], -1)
    return np.concatenate([rows, np.full((rows.shape[0], pad), 0xAB, np.uint8)], 1).tobytes()


@pytest.mark.parametrize("pad", [0, 7])
@pytest.mark.parametrize("big_endian", [0, 1])
@pytest.mark.parametrize("encoding", ["rgb8", "bgr8", "mono8"])
def test_raw_images_as_the_policy_node(ts, rgb, encoding, pad, big_endian):
    pixels = {"rgb8": rgb, "bgr8": rgb[:, :, ::-1], "mono8": rgb[:, :, 1]}[encoding]
    channels = 1 if encoding == "mono8" else 3
    expected = np.repeat(rgb[:, :, 1:2], 3, axis=2) if encoding == "mono8" else rgb
    fields = {"height": 12, "width": 10, "encoding": encoding, "is_bigendian": big_endian,
              "step": 10 * channels + pad}
    data = _padded(pixels, pad)
    ours = image_from_msg(_bag_image(ts, data, **fields))
    assert ours.shape == (12, 10, 3) and ours.dtype == np.uint8 and ours.flags.writeable
    np.testing.assert_array_equal(ours, expected)
    _assert_same_as_node(ours, _node_image(data, **fields))


@pytest.mark.parametrize(("ext", "fmt", "grey"), [
    (".jpg", "rgb8; jpeg compressed bgr8", False), (".jpg", "jpeg", False),
    (".png", "bgr8; png compressed bgr8", False), (".png", "png", False),
    (".png", "mono8; png compressed mono8", True), (".jpg", "mono8; jpeg compressed mono8", True)])
def test_compressed_images_as_the_policy_node(ts, rgb, ext, fmt, grey):
    source = rgb[:, :, 1] if grey else np.ascontiguousarray(rgb[:, :, ::-1])  # OpenCV: BGR
    data = cv2.imencode(ext, source)[1].tobytes()
    ours = image_from_msg(_bag_compressed(ts, data, fmt))
    assert ours.shape == (12, 10, 3) and ours.dtype == np.uint8
    expected = np.repeat(rgb[:, :, 1:2], 3, axis=2) if grey else rgb
    if ext == ".png":
        np.testing.assert_array_equal(ours, expected)
    else:
        assert np.abs(ours.astype(int) - expected).mean() < 4
    if grey:
        assert (ours[:, :, 0] == ours[:, :, 2]).all()
    _assert_same_as_node(ours, _node_compressed(data, fmt))


@pytest.mark.parametrize(("fields", "size", "message"), [
    ({"encoding": "16UC1", "step": 20}, 240, "unsupported image encoding '16UC1'; accepted: "
                                              "['bgr8', 'mono8', 'rgb8']"),
    ({"encoding": "bayer_rggb8", "step": 10}, 120, "unsupported image encoding 'bayer_rggb8'"),
    ({"encoding": "rgba8", "step": 40}, 480, "unsupported image encoding 'rgba8'"),
    ({"encoding": "rgb8", "step": 29}, 348, "step 29 is shorter than a row of 10 rgb8 pixels"),
    ({"encoding": "rgb8", "step": 30}, 359, "image data size mismatch: 359 bytes"),
    ({"encoding": "mono8", "step": 10, "width": 0}, 0, "empty image: 0x12")])
def test_raw_images_refused_as_the_policy_node(ts, fields, size, message):
    fields = {"height": 12, "width": 10, "is_bigendian": 0, **fields}
    data = bytes(size)
    with pytest.raises(ImageDecodeError) as err:
        image_from_msg(_bag_image(ts, data, **fields))
    assert message in str(err.value)
    node = _node_image(data, **fields)
    if node is not None:
        assert node == (None, str(err.value))


@pytest.mark.parametrize(("fmt", "data", "message"), [
    ("tiff", b"II*\x00", "unsupported compressed image format 'tiff'; accepted: ['jpeg', 'png']"),
    ("rgb8; jpeg compressed bgr8", b"\xff\xd8not a jpeg", "corrupt 'rgb8; jpeg compressed "
                                                           "bgr8' image data (12 bytes)"),
    ("png", b"", "corrupt 'png' image data (0 bytes)")])
def test_compressed_images_refused_as_the_policy_node(ts, fmt, data, message):
    with pytest.raises(ImageDecodeError) as err:
        image_from_msg(_bag_compressed(ts, data, fmt))
    assert str(err.value) == message
    node = _node_compressed(data, fmt)
    if node is not None:
        assert node == (None, message)


def test_rgba_png_is_refused_by_channel_count(ts, rgb):
    rgba = np.concatenate([rgb, np.full((12, 10, 1), 255, np.uint8)], axis=2)
    data = cv2.imencode(".png", rgba)[1].tobytes()
    try:
        out = image_from_msg(_bag_compressed(ts, data, "png"))
    except ImageDecodeError as err:  # OpenCV builds differ on IMREAD_ANYCOLOR with alpha
        assert "channels" in str(err)
        out = None
    node = _node_compressed(data, "png")
    if node is not None:
        assert (node[1] is None) == (out is not None)
        if out is not None:
            np.testing.assert_array_equal(out, node[0])


@pytest.mark.parametrize("camera_format", CAMERA_FORMATS)
def test_camera_msg_writes_what_image_from_msg_reads(ts, rgb, camera_format):
    msg = camera_msg(ts, _header(ts), rgb, camera_format)
    msgtype = COMPRESSED_IMAGE_TYPE if camera_format in ("jpeg", "png") else IMAGE_TYPE
    back = ts.deserialize_cdr(ts.serialize_cdr(msg, msgtype), msgtype)
    out = image_from_msg(back)
    luma = np.round(rgb @ np.array([0.299, 0.587, 0.114])).astype(np.uint8)
    if camera_format == "jpeg":
        assert back.format == "rgb8; jpeg compressed bgr8"
        assert np.abs(out.astype(int) - rgb).mean() < 4
    elif camera_format == "mono8":
        assert (back.encoding, back.step) == ("mono8", 10)
        np.testing.assert_array_equal(out, np.repeat(luma[:, :, None], 3, axis=2))
    else:
        np.testing.assert_array_equal(out, rgb)
    if image_conversion is not None and camera_format == "mono8":  # the node's grey too
        assert bytes(image_conversion.rgb_to_image(rgb, "mono8").data) == bytes(back.data)


def test_topic_types_per_camera_format():
    assert topic_types("rgb8") == TOPIC_TYPES == topic_types("mono8")
    jpeg = topic_types("jpeg")
    assert jpeg[TOPIC_THIRD_PERSON + "/compressed"] == COMPRESSED_IMAGE_TYPE
    assert jpeg[TOPIC_WRIST + "/compressed"] == COMPRESSED_IMAGE_TYPE
    assert TOPIC_WRIST not in jpeg and len(jpeg) == len(TOPIC_TYPES)
    with pytest.raises(ValueError, match="camera_format: expected one of .* got 'tiff'"):
        topic_types("tiff")
