"""rosbag2 export and read-back of episodes with ``rosbags`` (no ROS install needed).

Topics and types are the ones the real robot stack publishes, so a simulated episode plays
back through the same tooling as a real recording (``ros2 bag play``, rviz, the replay tools):

    /camera/third_person/image_raw   sensor_msgs/msg/Image (rgb8; or bgr8, mono8)
    /camera/wrist/image_raw          sensor_msgs/msg/Image (as the third-person camera)
    /joint_states                    sensor_msgs/msg/JointState (joint1..6 rad, gripper m)
    /ee_pose                         geometry_msgs/msg/PoseStamped (flange in base_link)
    /heisd/ee_command                heisd_ros/msg/EECommand (registered from msg/EECommand.msg)

With ``camera_format="jpeg"`` (or "png") the cameras are written as image_transport's
compressed transport publishes them: sensor_msgs/msg/CompressedImage on
``<camera topic>/compressed``, ``format`` "rgb8; jpeg compressed bgr8".

Bags are written as rosbag2 metadata version 9 (Jazzy/Kilted era); MCAP by default, sqlite3
on request. Episode identity (suite, task, seed, instruction, success) goes into the bag's
``custom_data``.

Images read back with :func:`image_from_msg`, which follows the policy node's conversion
(:mod:`heisd_ros.nodes.image_conversion`, cv_bridge's rules) on rosbags' messages without
rclpy: Image in rgb8/bgr8/mono8 (``step`` padding skipped, mono replicated to 3 channels) and
CompressedImage in jpeg/png; anything else raises :class:`ImageDecodeError` naming it.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from rosbags.rosbag2 import Reader, ReaderError, StoragePlugin, Writer
from rosbags.typesys import Stores, get_types_from_msg, get_typestore
from rosbags.typesys.store import Typestore

from heisd_ros.data.episode import JOINT_STATE_NAMES, EpisodeRecord

TOPIC_THIRD_PERSON = "/camera/third_person/image_raw"
TOPIC_WRIST = "/camera/wrist/image_raw"
TOPIC_JOINT_STATES = "/joint_states"
TOPIC_EE_POSE = "/ee_pose"
TOPIC_EE_COMMAND = "/heisd/ee_command"
EE_COMMAND_TYPE = "heisd_ros/msg/EECommand"
IMAGE_TYPE = "sensor_msgs/msg/Image"
COMPRESSED_IMAGE_TYPE = "sensor_msgs/msg/CompressedImage"
#: Camera message types that :func:`image_from_msg` reads.
IMAGE_TYPES = (IMAGE_TYPE, COMPRESSED_IMAGE_TYPE)
#: image_transport's compressed transport publishes on the raw topic + this suffix.
COMPRESSED_SUFFIX = "/compressed"
#: Image encodings the policy accepts -> channels (as heisd_ros.nodes.image_conversion).
ACCEPTED_ENCODINGS: dict[str, int] = {"rgb8": 3, "bgr8": 3, "mono8": 1}
#: CompressedImage formats the policy accepts (image_transport names).
ACCEPTED_FORMATS = ("jpeg", "png")
#: How the cameras can be written: an Image encoding or a CompressedImage format.
CAMERA_FORMATS = (*ACCEPTED_ENCODINGS, *ACCEPTED_FORMATS)
#: JPEG quality of written CompressedImages (image_transport's default).
JPEG_QUALITY = 95
TOPIC_TYPES: dict[str, str] = {
    TOPIC_THIRD_PERSON: IMAGE_TYPE, TOPIC_WRIST: IMAGE_TYPE,
    TOPIC_JOINT_STATES: "sensor_msgs/msg/JointState",
    TOPIC_EE_POSE: "geometry_msgs/msg/PoseStamped",
    TOPIC_EE_COMMAND: EE_COMMAND_TYPE,
}
CAMERA_FRAMES = {TOPIC_THIRD_PERSON: "third_person_camera_optical_frame",
                 TOPIC_WRIST: "wrist_camera_optical_frame"}
STORAGES = {"mcap": StoragePlugin.MCAP, "sqlite3": StoragePlugin.SQLITE3}
# EECommand.SOURCE_SCRIPTED: what produced the recorded commands unless told otherwise.
SOURCE_SCRIPTED = 4


def _zstd_errors() -> tuple[type[Exception], ...]:
    # rosbags decompresses with compression.zstd (Python >= 3.14) or backports.zstd.
    for name in ("compression.zstd", "backports.zstd", "zstandard"):
        try:
            return (importlib.import_module(name).ZstdError,)
        except (ImportError, AttributeError):
            continue
    return ()


#: What reading a damaged bag raises: rosbags' ReaderError, I/O errors, and the decompressor's
#: errors for a truncated or corrupt zstd-compressed bag (``ros2 bag record
#: --compression-mode file``; rosbags decompresses such a file when opening it).
READ_ERRORS: tuple[type[Exception], ...] = (ReaderError, OSError, EOFError, *_zstd_errors())


class ImageDecodeError(ValueError):
    """A camera message replay cannot use; the message names the encoding or format."""


def _check_camera_format(camera_format: str) -> None:
    if camera_format not in CAMERA_FORMATS:
        raise ValueError(f"camera_format: expected one of {list(CAMERA_FORMATS)}, got "
                         f"{camera_format!r}")


def camera_topic(topic: str, camera_format: str = "rgb8") -> str:
    """The topic a camera is written on: ``topic``, or ``topic/compressed`` for jpeg/png."""
    _check_camera_format(camera_format)
    return topic + COMPRESSED_SUFFIX if camera_format in ACCEPTED_FORMATS else topic


def topic_types(camera_format: str = "rgb8") -> dict[str, str]:
    """{topic: message type} of a written bag (:data:`TOPIC_TYPES` for raw cameras)."""
    _check_camera_format(camera_format)
    if camera_format in ACCEPTED_ENCODINGS:
        return dict(TOPIC_TYPES)
    cameras = {camera_topic(t, camera_format): COMPRESSED_IMAGE_TYPE
               for t in (TOPIC_THIRD_PERSON, TOPIC_WRIST)}
    return {**cameras, **{t: m for t, m in TOPIC_TYPES.items() if t not in CAMERA_FRAMES}}


def default_msg_dir() -> Path:
    """The package's ``msg/`` directory: the source checkout's, else the installed share dir."""
    source = Path(__file__).resolve().parents[2] / "msg"
    if (source / "EECommand.msg").is_file():
        return source
    try:
        from ament_index_python.packages import get_package_share_directory  # ROS installs only
        share = Path(get_package_share_directory("heisd_ros")) / "msg"
    except (ImportError, LookupError) as err:
        raise ValueError(f"msg_dir: EECommand.msg not found in {source} and no installed "
                         f"heisd_ros share directory ({err}); pass msg_dir explicitly") from err
    return share


def make_typestore(msg_dir: str | Path | None = None,
                   store: Stores = Stores.ROS2_KILTED) -> Typestore:
    """A rosbags typestore with the standard messages plus ``heisd_ros/msg/EECommand``."""
    path = Path(msg_dir) if msg_dir is not None else default_msg_dir()
    msg_file = path / "EECommand.msg"
    if not msg_file.is_file():
        raise ValueError(f"msg_dir: {msg_file} does not exist")
    typestore = get_typestore(store)
    typestore.register(get_types_from_msg(msg_file.read_text(), EE_COMMAND_TYPE))
    return typestore


def write_episode_bag(record: EpisodeRecord, path: str | Path, *, storage: str = "mcap",
                      start_time_ns: int = 0, frame_id: str = "base_link",
                      source: int = SOURCE_SCRIPTED, gripper_from_target: bool = True,
                      camera_format: str = "rgb8", typestore: Typestore | None = None) -> Path:
    """Write ``record`` as a rosbag2 directory at ``path`` (which must not exist yet).

    Message and log times are ``start_time_ns`` + the episode's ``stamp_s``; a command carries
    the stamp of the observation it was decided on, as EECommand.msg specifies.
    ``gripper_from_target=True`` marks recorded gripper changes as authoritative, so a strict
    driver executes them on replay. ``camera_format`` is one of :data:`CAMERA_FORMATS` (see
    the module docstring; mono8 and jpeg lose information).
    """
    if storage not in STORAGES:
        raise ValueError(f"storage: expected one of {sorted(STORAGES)}, got {storage!r}")
    types = topic_types(camera_format)
    ts = typestore or make_typestore()
    path = Path(path)
    with Writer(path, version=9, storage_plugin=STORAGES[storage]) as writer:
        for key in ("suite", "task", "instruction"):
            writer.set_custom_data(f"heisd.{key}", str(getattr(record, key)))
        writer.set_custom_data("heisd.seed", str(record.seed))
        writer.set_custom_data("heisd.success", str(bool(record.success)).lower())
        conns = {topic: writer.add_connection(topic, msgtype, typestore=ts)
                 for topic, msgtype in types.items()}
        for t in range(record.num_steps):
            stamp_ns = int(start_time_ns + round(float(record.stamp_s[t]) * 1e9))
            for topic, msg in _step_messages(ts, record, t, stamp_ns, frame_id, source,
                                             gripper_from_target, camera_format):
                writer.write(conns[topic], stamp_ns, ts.serialize_cdr(msg, types[topic]))
    return path


def camera_msg(ts: Typestore, header, rgb: np.ndarray, camera_format: str = "rgb8") -> object:
    """A rosbags Image or CompressedImage of (H, W, 3) uint8 RGB in ``camera_format``.

    Image rows are unpadded; mono8 is the ITU-R BT.601 luma, rounded (as the policy node's
    ``rgb_to_image``); jpeg/png are encoded from BGR as image_transport's compressed transport
    does, with its ``format`` string ("rgb8; jpeg compressed bgr8").
    """
    _check_camera_format(camera_format)
    rgb = np.ascontiguousarray(rgb, dtype=np.uint8)
    if rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ValueError(f"rgb: expected (H, W, 3) uint8, got {rgb.shape}")
    if camera_format in ACCEPTED_FORMATS:
        import cv2

        params = [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY] if camera_format == "jpeg" else []
        ok, data = cv2.imencode(".jpg" if camera_format == "jpeg" else ".png",
                                np.ascontiguousarray(rgb[:, :, ::-1]), params)
        if not ok:
            raise ValueError(f"OpenCV could not encode a {camera_format} image")
        return ts.types[COMPRESSED_IMAGE_TYPE](
            header=header, format=f"rgb8; {camera_format} compressed bgr8",
            data=data.reshape(-1))
    if camera_format == "rgb8":
        pixels = rgb
    elif camera_format == "bgr8":
        pixels = rgb[:, :, ::-1]
    else:
        pixels = np.round(rgb @ np.array([0.299, 0.587, 0.114])).astype(np.uint8)
    pixels = np.ascontiguousarray(pixels)
    return ts.types[IMAGE_TYPE](header=header, height=rgb.shape[0], width=rgb.shape[1],
                                encoding=camera_format, is_bigendian=0,
                                step=rgb.shape[1] * ACCEPTED_ENCODINGS[camera_format],
                                data=pixels.reshape(-1))


def _step_messages(ts: Typestore, record: EpisodeRecord, t: int, stamp_ns: int, frame_id: str,
                   source: int, gripper_from_target: bool,
                   camera_format: str = "rgb8") -> Iterator[tuple[str, object]]:
    types = ts.types
    stamp = types["builtin_interfaces/msg/Time"](sec=stamp_ns // 1_000_000_000,
                                                 nanosec=stamp_ns % 1_000_000_000)

    def header(frame: str):
        return types["std_msgs/msg/Header"](stamp=stamp, frame_id=frame)

    for topic, images in ((TOPIC_THIRD_PERSON, record.image_third_person),
                          (TOPIC_WRIST, record.image_wrist)):
        yield camera_topic(topic, camera_format), camera_msg(
            ts, header(CAMERA_FRAMES[topic]), images[t], camera_format)
    positions = np.append(record.joint_positions_rad[t], record.gripper_width_m[t])
    yield TOPIC_JOINT_STATES, types["sensor_msgs/msg/JointState"](
        header=header(frame_id), name=list(JOINT_STATE_NAMES), position=positions.astype(float),
        velocity=np.zeros(0), effort=np.zeros(0))
    x, y, z, w = (float(v) for v in record.ee_quat_xyzw[t])
    yield TOPIC_EE_POSE, types["geometry_msgs/msg/PoseStamped"](
        header=header(frame_id), pose=types["geometry_msgs/msg/Pose"](
            position=types["geometry_msgs/msg/Point"](*map(float, record.ee_position_m[t])),
            orientation=types["geometry_msgs/msg/Quaternion"](x=x, y=y, z=z, w=w)))
    action = np.asarray(record.action[t], dtype=np.float64)
    vec3 = types["geometry_msgs/msg/Vector3"]
    yield TOPIC_EE_COMMAND, types[EE_COMMAND_TYPE](
        header=header(frame_id), step_index=t, mode=0, translation_m=vec3(*action[:3]),
        rotation_rad=vec3(*action[3:6]), gripper=1 if action[6] >= 0.5 else 0,
        gripper_from_target=bool(gripper_from_target), source=int(source))


def read_bag_messages(path: str | Path, topics: Iterable[str] | None = None,
                      typestore: Typestore | None = None) -> Iterator[tuple[str, int, object]]:
    """(topic, log time ns, deserialised message) for every message, in log-time order."""
    ts = typestore or make_typestore()
    with Reader(Path(path)) as reader:
        wanted = set(topics) if topics is not None else None
        conns = [c for c in reader.connections if wanted is None or c.topic in wanted]
        for conn, timestamp, raw in reader.messages(connections=conns):
            yield conn.topic, timestamp, ts.deserialize_cdr(raw, conn.msgtype)


def first_messages(path: str | Path, topics: Iterable[str],
                   typestore: Typestore | None = None) -> dict[str, object]:
    """{topic: its first message in log-time order} for each of ``topics`` that has one.

    Reading stops as soon as every topic has been seen.
    """
    wanted, out = set(topics), {}
    ts = typestore or make_typestore()
    with Reader(Path(path)) as reader:
        conns = [c for c in reader.connections if c.topic in wanted]
        present = {c.topic for c in conns}
        for conn, _, raw in reader.messages(connections=conns):
            if conn.topic not in out:
                out[conn.topic] = ts.deserialize_cdr(raw, conn.msgtype)
                if len(out) == len(present):
                    break
    return out


def metadata_topics(path: str | Path) -> dict[str, tuple[str, int]]:
    """{topic: (message type, message count)} from ``metadata.yaml`` alone.

    Cheap (no storage file is opened or decompressed) and meant for probing: anything that is
    not a readable rosbag2 metadata file gives {}.
    """
    import yaml

    try:
        meta = yaml.safe_load((Path(path) / "metadata.yaml").read_text())
        entries = meta["rosbag2_bagfile_information"].get("topics_with_message_count") or []
        return {e["topic_metadata"]["name"]: (e["topic_metadata"]["type"],
                                              int(e.get("message_count", 0))) for e in entries}
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError, ValueError):
        return {}


def bag_topic_summary(path: str | Path) -> dict[str, tuple[str, int]]:
    """{topic: (message type, message count)} from a bag's metadata."""
    with Reader(Path(path)) as reader:
        return {c.topic: (c.msgtype, c.msgcount) for c in reader.connections}


def _byte_array(data) -> np.ndarray:
    # rosbags gives a uint8 ndarray, rclpy an array('B'); bytes come from hand-built messages.
    if isinstance(data, (bytes, bytearray, memoryview)):
        return np.frombuffer(data, dtype=np.uint8)
    return np.asarray(data, dtype=np.uint8).reshape(-1)


def _to_rgb(pixels: np.ndarray, encoding: str) -> np.ndarray:
    if encoding == "rgb8":
        return np.ascontiguousarray(pixels)
    if encoding == "bgr8":
        return np.ascontiguousarray(pixels[:, :, ::-1])
    return np.ascontiguousarray(np.repeat(pixels.reshape(*pixels.shape[:2], 1), 3, axis=2))


def raw_to_rgb(data, height: int, width: int, step: int, encoding: str) -> np.ndarray:
    """(H, W, 3) uint8 RGB of sensor_msgs/Image fields, with cv_bridge's rules.

    Rows are ``step`` bytes (padding after ``width * channels`` bytes is skipped); mono8 is
    replicated to 3 channels; ``is_bigendian`` is not needed, 8-bit data has no byte order.

    Raises:
        ImageDecodeError: an encoding other than rgb8/bgr8/mono8 (by name), an empty image, a
            ``step`` shorter than a row, or ``data`` other than ``step * height`` bytes.
    """
    if encoding not in ACCEPTED_ENCODINGS:
        raise ImageDecodeError(f"unsupported image encoding {encoding!r}; accepted: "
                               f"{sorted(ACCEPTED_ENCODINGS)}")
    channels = ACCEPTED_ENCODINGS[encoding]
    height, width, step = int(height), int(width), int(step)
    if height == 0 or width == 0:
        raise ImageDecodeError(f"empty image: {width}x{height}")
    if step < width * channels:
        raise ImageDecodeError(f"step {step} is shorter than a row of {width} {encoding} pixels "
                               f"({width * channels} bytes)")
    buffer = _byte_array(data)
    if buffer.size != step * height:
        raise ImageDecodeError(f"image data size mismatch: {buffer.size} bytes for "
                               f"{width}x{height} {encoding} with step {step} (expected "
                               f"{step * height})")
    # View the buffer as rows of `step` bytes, cut the padding; copy: the result is writable
    # and does not alias the message.
    rows = buffer.reshape(height, step)[:, :width * channels]
    return _to_rgb(rows.reshape(height, width, channels).copy(), encoding)


def compressed_kind(fmt: str) -> str:
    """The kind, jpeg or png, of a CompressedImage ``format`` ("rgb8; jpeg compressed bgr8")."""
    text = fmt.lower()
    for kind, names in (("jpeg", ("jpeg", "jpg")), ("png", ("png",))):
        if any(name in text for name in names):
            return kind
    raise ImageDecodeError(f"unsupported compressed image format {fmt!r}; accepted: "
                           f"{list(ACCEPTED_FORMATS)}")


def compressed_to_rgb(data, fmt: str) -> np.ndarray:
    """(H, W, 3) uint8 RGB of CompressedImage fields, decoded with ``cv2.imdecode``.

    Grey images are replicated to 3 channels, colour ones converted from OpenCV's BGR.

    Raises:
        ImageDecodeError: a format other than jpeg/png (by name), data OpenCV cannot decode,
            or a decoded image that is not 8-bit grey or 3-channel colour.
    """
    import cv2

    compressed_kind(fmt)
    buffer = _byte_array(data)
    try:
        image = cv2.imdecode(buffer, cv2.IMREAD_ANYCOLOR) if buffer.size else None
    except cv2.error:
        image = None
    if image is None:
        raise ImageDecodeError(f"corrupt {fmt!r} image data ({buffer.size} bytes)")
    if image.dtype != np.uint8:
        raise ImageDecodeError(f"unsupported compressed image depth {image.dtype} (8-bit only)")
    if image.ndim == 2:
        return _to_rgb(image, "mono8")
    if image.shape[2] == 3:
        return _to_rgb(image, "bgr8")  # OpenCV decodes to BGR
    raise ImageDecodeError(f"unsupported compressed image with {image.shape[2]} channels")


def image_from_msg(msg) -> np.ndarray:
    """(H, W, 3) uint8 RGB of a sensor_msgs Image or CompressedImage (rosbags or rclpy).

    The same pixels as the policy node's conversion of the same message (see
    :func:`raw_to_rgb` and :func:`compressed_to_rgb`).

    Raises:
        ImageDecodeError: what the policy node refuses too, naming the encoding or format.
    """
    if getattr(msg, "encoding", None) is None:  # CompressedImage: format + data only
        return compressed_to_rgb(msg.data, msg.format)
    return raw_to_rgb(msg.data, msg.height, msg.width, msg.step, msg.encoding)
