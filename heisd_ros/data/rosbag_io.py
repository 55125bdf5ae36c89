"""rosbag2 export and read-back of episodes with ``rosbags`` (no ROS install needed).

Topics and types are the ones the real robot stack publishes, so a simulated episode plays
back through the same tooling as a real recording (``ros2 bag play``, rviz, the replay tools):

    /camera/third_person/image_raw   sensor_msgs/msg/Image (rgb8)
    /camera/wrist/image_raw          sensor_msgs/msg/Image (rgb8)
    /joint_states                    sensor_msgs/msg/JointState (joint1..6 rad, gripper m)
    /ee_pose                         geometry_msgs/msg/PoseStamped (flange in base_link)
    /heisd/ee_command                heisd_ros/msg/EECommand (registered from msg/EECommand.msg)

Bags are written as rosbag2 metadata version 9 (Jazzy/Kilted era); MCAP by default, sqlite3
on request. Episode identity (suite, task, seed, instruction, success) goes into the bag's
``custom_data``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from rosbags.rosbag2 import Reader, StoragePlugin, Writer
from rosbags.typesys import Stores, get_types_from_msg, get_typestore
from rosbags.typesys.store import Typestore

from heisd_ros.data.episode import JOINT_STATE_NAMES, EpisodeRecord

TOPIC_THIRD_PERSON = "/camera/third_person/image_raw"
TOPIC_WRIST = "/camera/wrist/image_raw"
TOPIC_JOINT_STATES = "/joint_states"
TOPIC_EE_POSE = "/ee_pose"
TOPIC_EE_COMMAND = "/heisd/ee_command"
EE_COMMAND_TYPE = "heisd_ros/msg/EECommand"
TOPIC_TYPES: dict[str, str] = {
    TOPIC_THIRD_PERSON: "sensor_msgs/msg/Image", TOPIC_WRIST: "sensor_msgs/msg/Image",
    TOPIC_JOINT_STATES: "sensor_msgs/msg/JointState",
    TOPIC_EE_POSE: "geometry_msgs/msg/PoseStamped",
    TOPIC_EE_COMMAND: EE_COMMAND_TYPE,
}
CAMERA_FRAMES = {TOPIC_THIRD_PERSON: "third_person_camera_optical_frame",
                 TOPIC_WRIST: "wrist_camera_optical_frame"}
STORAGES = {"mcap": StoragePlugin.MCAP, "sqlite3": StoragePlugin.SQLITE3}
# EECommand.SOURCE_SCRIPTED: what produced the recorded commands unless told otherwise.
SOURCE_SCRIPTED = 4


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
                      typestore: Typestore | None = None) -> Path:
    """Write ``record`` as a rosbag2 directory at ``path`` (which must not exist yet).

    Message and log times are ``start_time_ns`` + the episode's ``stamp_s``; a command carries
    the stamp of the observation it was decided on, as EECommand.msg specifies.
    ``gripper_from_target=True`` marks recorded gripper changes as authoritative, so a strict
    driver executes them on replay.
    """
    if storage not in STORAGES:
        raise ValueError(f"storage: expected one of {sorted(STORAGES)}, got {storage!r}")
    ts = typestore or make_typestore()
    path = Path(path)
    with Writer(path, version=9, storage_plugin=STORAGES[storage]) as writer:
        for key in ("suite", "task", "instruction"):
            writer.set_custom_data(f"heisd.{key}", str(getattr(record, key)))
        writer.set_custom_data("heisd.seed", str(record.seed))
        writer.set_custom_data("heisd.success", str(bool(record.success)).lower())
        conns = {topic: writer.add_connection(topic, msgtype, typestore=ts)
                 for topic, msgtype in TOPIC_TYPES.items()}
        for t in range(record.num_steps):
            stamp_ns = int(start_time_ns + round(float(record.stamp_s[t]) * 1e9))
            for topic, msg in _step_messages(ts, record, t, stamp_ns, frame_id, source,
                                             gripper_from_target):
                writer.write(conns[topic], stamp_ns, ts.serialize_cdr(msg, TOPIC_TYPES[topic]))
    return path


def _step_messages(ts: Typestore, record: EpisodeRecord, t: int, stamp_ns: int, frame_id: str,
                   source: int, gripper_from_target: bool) -> Iterator[tuple[str, object]]:
    types = ts.types
    stamp = types["builtin_interfaces/msg/Time"](sec=stamp_ns // 1_000_000_000,
                                                 nanosec=stamp_ns % 1_000_000_000)

    def header(frame: str):
        return types["std_msgs/msg/Header"](stamp=stamp, frame_id=frame)

    for topic, images in ((TOPIC_THIRD_PERSON, record.image_third_person),
                          (TOPIC_WRIST, record.image_wrist)):
        image = np.ascontiguousarray(images[t], dtype=np.uint8)
        yield topic, types["sensor_msgs/msg/Image"](
            header=header(CAMERA_FRAMES[topic]), height=image.shape[0], width=image.shape[1],
            encoding="rgb8", is_bigendian=0, step=image.shape[1] * 3, data=image.reshape(-1))
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


def bag_topic_summary(path: str | Path) -> dict[str, tuple[str, int]]:
    """{topic: (message type, message count)} from a bag's metadata."""
    with Reader(Path(path)) as reader:
        return {c.topic: (c.msgtype, c.msgcount) for c in reader.connections}


def image_from_msg(msg) -> np.ndarray:
    """(H, W, 3) uint8 RGB from a sensor_msgs/Image in rgb8 or bgr8 (honours ``step`` padding)."""
    if msg.encoding not in ("rgb8", "bgr8"):
        raise ValueError(f"encoding: only rgb8/bgr8 are handled here, got {msg.encoding!r}")
    rows = np.asarray(msg.data, dtype=np.uint8).reshape(msg.height, msg.step)
    image = rows[:, : msg.width * 3].reshape(msg.height, msg.width, 3)
    return image[..., ::-1].copy() if msg.encoding == "bgr8" else image.copy()
