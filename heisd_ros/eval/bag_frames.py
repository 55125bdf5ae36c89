"""Frames of any rosbag2 for open-loop replay: check the bag, pair cameras with robot state.

:func:`inspect_bag` fails with a :class:`BagError` whose message says what was found (topics
with types and message counts), what is needed and which ``--topic-*`` option remaps it, for
a missing path, a directory that is no bag, an empty bag, a truncated or corrupt storage file,
a split bag with missing parts, and missing or mistyped topics. :func:`iter_frames` pairs each
primary-camera image with the wrist image closest in header stamp (within ``max_skew_s``) and
the latest joint state and EE pose, and yields :class:`Observation` objects.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from heisd_ros.data.bag_topics import (
    METADATA_FILE,
    ROLES,
    BagTopics,
    bag_information,
    found_and_needed,
    missing_topic,
    option,
    remap_hint,
)
from heisd_ros.data.observation import Observation
from heisd_ros.data.rosbag_io import READ_ERRORS, image_from_msg, make_typestore

#: The roles replay reads -> whether each is required (its topic must be in the bag; '' still
#: disables it). Each camera may be an Image or a CompressedImage (``ROLES[role].accepts``).
REPLAY_ROLES = {"primary": True, "wrist": True, "joint_states": False, "ee_pose": False}


class BagError(ValueError):
    """A bag that cannot be replayed; the message is meant for the user as is."""


@dataclass
class BagInfo:
    """What :func:`inspect_bag` found: the bag directory, its topics and custom data."""

    path: Path
    topics: dict[str, tuple[str, int]]
    files: list[str]
    storage: str
    custom_data: dict = field(default_factory=dict)
    missing_optional: list[str] = field(default_factory=list)


def _open_checks(path: Path) -> tuple[Path, dict]:
    if not path.exists():
        raise BagError(f"{path}: no such file or directory; expected a rosbag2 directory "
                       f"(the one holding {METADATA_FILE})")
    if path.is_file():
        parent = path.parent
        hint = (f"pass the bag directory {parent} instead" if (parent / METADATA_FILE).is_file()
                else f"it has no {METADATA_FILE} next to it; run `ros2 bag reindex {parent}`")
        raise BagError(f"{path}: is a file; replay needs the rosbag2 directory ({hint})")
    if not (path / METADATA_FILE).is_file():
        files = sorted(p.name for p in path.iterdir())
        raise BagError(f"{path}: no {METADATA_FILE}, so this is not a rosbag2 directory (found "
                       f"{files or 'nothing'}); if it holds .mcap/.db3 files from an "
                       f"interrupted recording, `ros2 bag reindex {path}` restores it")
    meta = bag_information(path, BagError)
    files = [str(f) for f in meta.get("relative_file_paths") or []]
    missing = [f for f in files if not (path / f).is_file()]
    if missing:
        split = f"split over {len(files)} files" if len(files) > 1 else "made of 1 file"
        raise BagError(f"{path}: the bag is {split} ({files}) but {missing} are missing; copy "
                       f"every file of the bag, or reindex the parts present with "
                       f"`ros2 bag reindex {path}`")
    return path, meta


def inspect_bag(path: str | Path, topics: BagTopics) -> BagInfo:
    """Check that ``path`` is a readable rosbag2 with the topics replay needs (see module doc)."""
    from rosbags.rosbag2 import Reader

    path, meta = _open_checks(Path(path))
    try:
        with Reader(path) as reader:
            found = {c.topic: (c.msgtype, c.msgcount) for c in reader.connections}
    except (*READ_ERRORS, ValueError, KeyError) as err:
        raise BagError(f"{path}: the bag cannot be read ({type(err).__name__}: {err}); the "
                       f"storage file is probably truncated or corrupt (recording killed?). "
                       f"Storage {meta.get('storage_identifier')!r}, files "
                       f"{meta.get('relative_file_paths')}") from err
    info = BagInfo(path, found, [str(f) for f in meta.get("relative_file_paths") or []],
                   str(meta.get("storage_identifier", "")), dict(meta.get("custom_data") or {}))
    total = sum(n for _, n in found.values())
    problems = []
    for role, required in REPLAY_ROLES.items():
        msgtypes = ROLES[role].accepts
        msgtype = " or ".join(msgtypes)
        topic = getattr(topics, role)
        if not topic:
            continue
        if topic not in found:
            if required:
                problems.append(missing_topic(role, topic, msgtypes, f"the {role} camera"))
            else:
                info.missing_optional.append(topic)
        elif found[topic][0] not in msgtypes:
            problems.append(f"  {topic}: has type {found[topic][0]}, replay needs {msgtype}; "
                            f"{remap_hint(role)}")
        elif required and found[topic][1] == 0:
            problems.append(f"  {topic} ({msgtype}): 0 messages")
    if problems or total == 0:
        head = "the bag is empty (0 messages)" if total == 0 else "the bag cannot be replayed"
        raise BagError(f"{path}: {head}.\n"
                       + found_and_needed(found, problems or ["  messages on the camera topics"])
                       + "\nReplay needs " + ", ".join(
                           f"{role} {' or '.join(ROLES[role].accepts)} ({option(role)})"
                           for role, required in REPLAY_ROLES.items() if required)
                       + "; optional: joint states and EE pose (--topic-joint-states, "
                         "--topic-ee-pose). Pass --topic-wrist '' for a bag without a wrist "
                         "camera.")
    return info


def _stamp_s(msg, log_ns: int) -> float:
    header = getattr(msg, "header", None)
    if header is not None and (header.stamp.sec or header.stamp.nanosec):
        return header.stamp.sec + header.stamp.nanosec * 1e-9
    return log_ns * 1e-9


def _quat_to_rpy(x: float, y: float, z: float, w: float) -> np.ndarray:
    """Extrinsic XYZ roll, pitch, yaw (rad) of a unit quaternion."""
    from heisd_ros.robot.poses import matrix_to_rpy

    rot = np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
                    [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
                    [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]])
    return matrix_to_rpy(rot)


@dataclass
class _State:
    ee_position_m: np.ndarray | None = None
    ee_rpy_rad: np.ndarray | None = None
    gripper_width_m: float = 0.0
    joints_rad: np.ndarray | None = None

    def update(self, role: str, msg) -> None:
        if role == "ee_pose":
            p, q = msg.pose.position, msg.pose.orientation
            self.ee_position_m = np.array([p.x, p.y, p.z])
            self.ee_rpy_rad = _quat_to_rpy(q.x, q.y, q.z, q.w)
        elif role == "joint_states":
            names, pos = list(msg.name), np.asarray(msg.position, dtype=float)
            if "gripper" in names:
                self.gripper_width_m = float(pos[names.index("gripper")])
            self.joints_rad = pos[:6]

    def proprio(self) -> np.ndarray | None:
        if self.ee_position_m is None:
            return None
        return np.concatenate([self.ee_position_m, self.ee_rpy_rad, [self.gripper_width_m]])


def iter_frames(info: BagInfo, topics: BagTopics, instruction: str, max_frames: int | None = None,
                max_skew_s: float = 0.05) -> Iterator[Observation]:
    """Paired observations of the bag in log-time order (see the module docstring).

    A primary image without a wrist image within ``max_skew_s`` is skipped. Each observation's
    ``extras`` carry ``frame`` (index), ``ee_position_m`` (or None) and ``skipped_frames``.
    """
    from rosbags.rosbag2 import Reader

    roles = {topic: role for role, topic in topics.active(REPLAY_ROLES).items()
             if topic in info.topics}
    ts, state = make_typestore(), _State()
    pending, wrist, ready, count, skipped = None, None, None, 0, 0

    def emit(primary, wrist_image):
        stamp, image = primary
        return Observation(image_primary=image, image_wrist=wrist_image, instruction=instruction,
                           proprio=state.proprio(), stamp_s=stamp,
                           extras={"frame": count, "skipped_frames": skipped,
                                   "ee_position_m": state.ee_position_m,
                                   "joint_positions_rad": state.joints_rad})

    try:
        with Reader(info.path) as reader:
            conns = [c for c in reader.connections if c.topic in roles]
            for conn, log_ns, raw in reader.messages(connections=conns):
                # A paired frame is emitted once every message logged at its time was read,
                # so it carries the state of its own time step (not the previous one).
                if ready is not None and log_ns > ready[2]:
                    yield emit(ready[0], ready[1])
                    count, ready = count + 1, None
                if max_frames is not None and count >= max_frames:
                    return
                role = roles[conn.topic]
                msg = ts.deserialize_cdr(raw, conn.msgtype)
                if role in ("joint_states", "ee_pose"):
                    state.update(role, msg)
                    continue
                try:
                    item = (_stamp_s(msg, log_ns), image_from_msg(msg))
                except ValueError as err:
                    raise BagError(f"{conn.topic}: {err}; convert the images to rgb8, bgr8 "
                                   f"or mono8, or jpeg/png CompressedImage (e.g. with "
                                   f"image_proc) before replaying") from err
                if role == "wrist":
                    wrist = item
                    if pending is not None and abs(pending[0] - wrist[0]) <= max_skew_s:
                        ready, pending = (pending, wrist[1], log_ns), None
                    continue
                if pending is not None or ready is not None:
                    skipped += 1  # a newer primary frame replaces an unpaired or unsent one
                pending, ready = item, None
                if not topics.wrist or (wrist is not None
                                        and abs(wrist[0] - item[0]) <= max_skew_s
                                        and wrist[0] >= item[0]):
                    ready = (item, wrist[1] if topics.wrist else None, log_ns)
                    pending = None
            if ready is not None and (max_frames is None or count < max_frames):
                yield emit(ready[0], ready[1])
    except READ_ERRORS as err:
        raise BagError(f"{info.path}: reading stopped after {count} frames ({err}); the bag is "
                       f"probably truncated") from err
