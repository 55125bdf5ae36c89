"""sensor_msgs Image / CompressedImage <-> numpy, with cv_bridge's semantics.

The policy accepts rgb8, bgr8 and mono8 (every camera driver offers one of them) and always
works on (H, W, 3) uint8 RGB; any other encoding is refused with its name, never guessed.
Where the ROS 2 ``cv_bridge`` is importable it does the conversion; otherwise this module
follows its rules: rows are ``step`` bytes long (padding after ``width * channels`` bytes is
skipped), ``is_bigendian`` is honoured (it only matters for multi-byte depths, none of which
are accepted here), CompressedImage data is decoded with OpenCV (``cv2.imdecode``, BGR or
gray) and ``format`` may be "jpeg", "png" or image_transport's "rgb8; jpeg compressed bgr8".
"""

from __future__ import annotations

import numpy as np
from sensor_msgs.msg import CompressedImage, Image

#: Encodings the policy accepts -> channels.
ACCEPTED_ENCODINGS: dict[str, int] = {"rgb8": 3, "bgr8": 3, "mono8": 1}
#: Compressed formats the policy accepts (image_transport names).
ACCEPTED_FORMATS = ("jpeg", "png")


class ImageConversionError(ValueError):
    """An image the policy cannot use; the message names the problem (encoding, size)."""


def _cv_bridge():
    try:
        from cv_bridge import CvBridge
    except ImportError:
        return None
    return CvBridge()


_BRIDGE = _cv_bridge()


def _check_encoding(encoding: str) -> int:
    if encoding not in ACCEPTED_ENCODINGS:
        raise ImageConversionError(
            f"unsupported image encoding {encoding!r}; accepted: {sorted(ACCEPTED_ENCODINGS)}")
    return ACCEPTED_ENCODINGS[encoding]


def _to_rgb(image: np.ndarray, encoding: str) -> np.ndarray:
    if encoding == "rgb8":
        return np.ascontiguousarray(image)
    if encoding == "bgr8":
        return np.ascontiguousarray(image[:, :, ::-1])
    return np.ascontiguousarray(np.repeat(image.reshape(image.shape[0], image.shape[1], 1), 3,
                                          axis=2))


def image_to_rgb(msg: Image) -> np.ndarray:
    """(H, W, 3) uint8 RGB of an Image message.

    Raises:
        ImageConversionError: an unsupported encoding (by name), an empty image, a ``step``
            shorter than a row, or ``data`` shorter or longer than ``step * height``.
    """
    channels = _check_encoding(msg.encoding)
    height, width, step = int(msg.height), int(msg.width), int(msg.step)
    if height == 0 or width == 0:
        raise ImageConversionError(f"empty image: {width}x{height}")
    if step < width * channels:
        raise ImageConversionError(f"step {step} is shorter than a row of {width} {msg.encoding} "
                                   f"pixels ({width * channels} bytes)")
    size = len(msg.data)
    if size != step * height:
        raise ImageConversionError(f"image data size mismatch: {size} bytes for {width}x{height} "
                                   f"{msg.encoding} with step {step} (expected {step * height})")
    if _BRIDGE is not None:
        return _to_rgb(np.asarray(_BRIDGE.imgmsg_to_cv2(msg, "passthrough")), msg.encoding)
    # cv_bridge: view the buffer as rows of `step` bytes, then cut the padding. 8-bit data has
    # no byte order, so is_bigendian changes nothing for the accepted encodings.
    buffer = np.frombuffer(bytes(msg.data), dtype=np.uint8)
    rows = buffer.reshape(height, step)[:, :width * channels]
    return _to_rgb(rows.reshape(height, width, channels).copy(), msg.encoding)  # writable


def rgb_to_image(rgb: np.ndarray, encoding: str = "rgb8") -> Image:
    """An Image message (no header) of (H, W, 3) uint8 RGB, in ``encoding``, unpadded."""
    rgb = np.asarray(rgb)
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise ImageConversionError(f"expected (H, W, 3) uint8 RGB, got {rgb.shape} {rgb.dtype}")
    channels = _check_encoding(encoding)
    if encoding == "rgb8":
        pixels = rgb
    elif encoding == "bgr8":
        pixels = rgb[:, :, ::-1]
    else:  # ITU-R BT.601 luma, as cv2.COLOR_RGB2GRAY
        pixels = np.round(rgb @ np.array([0.299, 0.587, 0.114])).astype(np.uint8)
    pixels = np.ascontiguousarray(pixels)
    if _BRIDGE is not None:
        return _BRIDGE.cv2_to_imgmsg(pixels, encoding)
    msg = Image(height=rgb.shape[0], width=rgb.shape[1], encoding=encoding, is_bigendian=0,
                step=rgb.shape[1] * channels)
    msg.data = pixels.tobytes()
    return msg


def _compressed_kind(fmt: str) -> str:
    # image_transport writes e.g. "rgb8; jpeg compressed bgr8"; plain "jpeg"/"png" also occur.
    text = fmt.lower()
    for kind, names in (("jpeg", ("jpeg", "jpg")), ("png", ("png",))):
        if any(name in text for name in names):
            return kind
    raise ImageConversionError(
        f"unsupported compressed image format {fmt!r}; accepted: {list(ACCEPTED_FORMATS)}")


def compressed_to_rgb(msg: CompressedImage) -> np.ndarray:
    """(H, W, 3) uint8 RGB of a jpeg/png CompressedImage.

    Raises:
        ImageConversionError: another format (by name), or data OpenCV cannot decode.
    """
    import cv2

    _compressed_kind(msg.format)
    if _BRIDGE is not None:
        image = np.asarray(_BRIDGE.compressed_imgmsg_to_cv2(msg, "passthrough"))
    else:
        buffer = np.frombuffer(bytes(msg.data), dtype=np.uint8)
        image = cv2.imdecode(buffer, cv2.IMREAD_ANYCOLOR) if buffer.size else None
    if image is None:
        raise ImageConversionError(f"corrupt {msg.format!r} image data ({len(msg.data)} bytes)")
    if image.dtype != np.uint8:
        raise ImageConversionError(f"unsupported compressed image depth {image.dtype} "
                                   f"(8-bit only)")
    if image.ndim == 2:
        return _to_rgb(image, "mono8")
    if image.shape[2] == 3:
        return _to_rgb(image, "bgr8")  # OpenCV decodes to BGR
    raise ImageConversionError(f"unsupported compressed image with {image.shape[2]} channels")


def rgb_to_compressed(rgb: np.ndarray, fmt: str = "jpeg", quality: int = 95) -> CompressedImage:
    """A CompressedImage (no header) of (H, W, 3) uint8 RGB as jpeg or png."""
    import cv2

    kind = _compressed_kind(fmt)
    bgr = np.ascontiguousarray(np.asarray(rgb, dtype=np.uint8)[:, :, ::-1])
    params = [cv2.IMWRITE_JPEG_QUALITY, quality] if kind == "jpeg" else []
    ok, data = cv2.imencode(".jpg" if kind == "jpeg" else ".png", bgr, params)
    if not ok:
        raise ImageConversionError(f"OpenCV could not encode a {kind} image")
    msg = CompressedImage(format=kind)
    msg.data = data.tobytes()
    return msg
