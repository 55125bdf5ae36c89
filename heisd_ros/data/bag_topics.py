"""Topic roles of a rosbag2 recording: the one table of role -> topic and its ``--topic-*`` remaps.

Bag readers (:mod:`heisd_ros.data.bag_episodes` for heisd-build-db,
:mod:`heisd_ros.eval.bag_frames` for heisd-replay) find each message stream by its *role*
(primary camera, wrist camera, joint states, EE pose, EE commands). :class:`BagTopics` holds
the topic of every role, defaulting to the topics :mod:`heisd_ros.data.rosbag_io` writes;
each role is remapped on the command line with ``--topic-<role>`` (underscores as dashes),
see :func:`add_topic_arguments` and :meth:`BagTopics.from_args`. A reader names the roles it
uses; an empty topic disables a role the reader treats as optional.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import NamedTuple

import numpy as np

from heisd_ros.data.rosbag_io import (
    EE_COMMAND_TYPE,
    IMAGE_TYPE,
    IMAGE_TYPES,
    TOPIC_EE_COMMAND,
    TOPIC_EE_POSE,
    TOPIC_JOINT_STATES,
    TOPIC_THIRD_PERSON,
    TOPIC_TYPES,
    TOPIC_WRIST,
)


class Role(NamedTuple):
    """What a role carries: the type heisd-record writes, every type a reader can decode."""

    msgtype: str
    accepts: tuple[str, ...]
    help: str


#: role -> message types and option help; the roles are the fields of :class:`BagTopics`.
ROLES: dict[str, Role] = {
    "primary": Role(IMAGE_TYPE, IMAGE_TYPES, "third-person camera"),
    "wrist": Role(IMAGE_TYPE, IMAGE_TYPES, "wrist camera"),
    "joint_states": Role(TOPIC_TYPES[TOPIC_JOINT_STATES], (TOPIC_TYPES[TOPIC_JOINT_STATES],),
                         "joint states"),
    "ee_pose": Role(TOPIC_TYPES[TOPIC_EE_POSE], (TOPIC_TYPES[TOPIC_EE_POSE],),
                    "PoseStamped EE pose"),
    "ee_command": Role(EE_COMMAND_TYPE, (EE_COMMAND_TYPE,), "heisd_ros/msg/EECommand actions"),
}


def option(role: str) -> str:
    """The command-line option that remaps ``role``: ``--topic-<role>``."""
    if role not in ROLES:
        raise KeyError(f"unknown topic role {role!r}; roles: {list(ROLES)}")
    return "--topic-" + role.replace("_", "-")


def remap_hint(role: str) -> str:
    """The end of a message about the topic of ``role``: which option remaps it."""
    return f"remap with {option(role)} TOPIC"


@dataclass(frozen=True)
class BagTopics:
    """Topic of each role; an empty string disables a role its reader treats as optional."""

    primary: str = TOPIC_THIRD_PERSON
    wrist: str = TOPIC_WRIST
    joint_states: str = TOPIC_JOINT_STATES
    ee_pose: str = TOPIC_EE_POSE
    ee_command: str = TOPIC_EE_COMMAND

    @classmethod
    def from_args(cls, args: argparse.Namespace, roles: Iterable[str]) -> BagTopics:
        """The topics of ``roles`` given by :func:`add_topic_arguments`; others default."""
        return cls(**topic_options(args, roles))

    def require(self, roles: Iterable[str]) -> None:
        """Raise ValueError, naming the option, for the first of ``roles`` left empty."""
        for role in roles:
            if not getattr(self, role):
                raise ValueError(f"{option(role)}: the {role} topic is required")

    def active(self, roles: Iterable[str] | None = None) -> dict[str, str]:
        """The topic of every enabled role (of ``roles``, default all), by role."""
        names = [f.name for f in fields(self)] if roles is None else list(roles)
        return {role: getattr(self, role) for role in names if getattr(self, role)}


def add_topic_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                        roles: Iterable[str], optional: Iterable[str] = (),
                        find_compressed: bool = False) -> None:
    """Add ``--topic-<role>`` for each of ``roles``, defaulting to :class:`BagTopics`' topics.

    Args:
        parser: the parser or argument group to add to.
        roles: the roles the tool reads.
        optional: roles that '' disables (said in the help).
        find_compressed: the cameras default to None (the tool then looks for the default
            topic or its ``/compressed`` topic in the bag).
    """
    defaults, optional = BagTopics(), set(optional)
    for role in roles:
        default = getattr(defaults, role)
        none = ", '' = none" if role in optional else ""
        if find_compressed and ROLES[role].accepts == IMAGE_TYPES:
            parser.add_argument(option(role), default=None,
                                help=f"{ROLES[role].help}{none} (default {default}, or its "
                                     f"/compressed topic)")
        else:
            parser.add_argument(option(role), default=default,
                                help=f"{ROLES[role].help}{none} (default {default})")


def topic_options(args: argparse.Namespace, roles: Iterable[str]) -> dict[str, str | None]:
    """{role: its ``--topic-<role>`` value} of parsed arguments, for ``roles``."""
    return {role: getattr(args, "topic_" + role) for role in roles}


def format_found(found: dict[str, tuple[str, int]]) -> str:
    """The lines listing a bag's {topic: (type, message count)}, for an error message."""
    if not found:
        return "  (no topics)"
    return "\n".join(f"  {t}  {ty}  ({n} messages)" for t, (ty, n) in sorted(found.items()))


def found_and_needed(found: dict[str, tuple[str, int]], problems: list[str]) -> str:
    """The "Found ... Needed ..." block of an error message about a bag's topics."""
    return (f"Found (topic, type, messages):\n{format_found(found)}\nNeeded:\n"
            + "\n".join(problems))


def missing_topic(role: str, topic: str, msgtypes: Iterable[str], label: str = "") -> str:
    """The line of a needed topic not in the bag: topic, types, role and the remap option."""
    return (f"  {topic} ({' or '.join(msgtypes)}) for {label or role}: not in the bag; "
            f"{remap_hint(role)}")


#: The rosbag2 index file in a bag directory.
METADATA_FILE = "metadata.yaml"


def bag_information(path, error: type[Exception] = ValueError) -> dict:
    """``rosbag2_bagfile_information`` of the bag directory ``path``'s metadata.yaml.

    An unreadable or malformed file raises ``error`` with the path, the reason and the
    ``ros2 bag reindex`` command that rebuilds it from intact storage files.
    """
    import yaml

    meta_file = Path(path) / METADATA_FILE
    try:
        return yaml.safe_load(meta_file.read_text(encoding="utf-8"))[
            "rosbag2_bagfile_information"]
    except (OSError, yaml.YAMLError, KeyError, TypeError) as err:
        raise error(f"{path}: {METADATA_FILE} is unreadable ({err}); if the storage files are "
                    f"intact, `ros2 bag reindex {path}` rebuilds it") from err


#: rosbags reads rosbag2 metadata of these versions (rosbag2 itself writes 1..9).
SUPPORTED_METADATA_VERSIONS = range(1, 10)
#: Storage plugins rosbags reads.
SUPPORTED_STORAGES = ("mcap", "sqlite3")
#: Storage file endings of an unindexed recording.
STORAGE_SUFFIXES = (".mcap", ".db3")


def storage_files(meta: dict) -> list[str]:
    """The storage file names of a bag's metadata, relative to the bag directory.

    Metadata before version 4 lists them with the bag directory in front
    ("my_bag/my_bag_0.db3"); rosbag2 and rosbags then take the file name alone, and so does
    this.
    """
    return [Path(str(f)).name for f in meta.get("relative_file_paths") or []]


def check_bag_dir(path: str | Path, error: type[Exception] = ValueError) -> dict:
    """Check that ``path`` is a rosbag2 directory a reader can open; its metadata.

    Each failure raises ``error`` naming its cause and the fix: no such path; a file (pass its
    directory); a folder of bags (pass one); storage files without metadata (``ros2 bag
    reindex``); a metadata version, storage plugin, serialization format or compression this
    reader does not support; storage files the metadata lists that are missing.
    """
    path = Path(path)
    if not path.exists():
        raise error(f"{path}: no such file or directory; expected a rosbag2 directory (the "
                    f"one holding {METADATA_FILE})")
    if path.is_file():
        parent = path.parent
        hint = (f"pass the bag directory {parent} instead" if (parent / METADATA_FILE).is_file()
                else f"it has no {METADATA_FILE} next to it; `ros2 bag reindex {parent}` "
                     f"rebuilds one")
        raise error(f"{path}: is a file; a rosbag2 directory is needed ({hint})")
    if not (path / METADATA_FILE).is_file():
        bags = sorted(str(p.parent.relative_to(path)) for p in path.rglob(METADATA_FILE))
        if bags:
            shown = ", ".join(bags[:5]) + (", ..." if len(bags) > 5 else "")
            raise error(f"{path}: is a folder of {len(bags)} bags ({shown}), not a bag; pass "
                        f"one bag directory")
        files = sorted(p.name for p in path.iterdir())
        if any(name.endswith(STORAGE_SUFFIXES) for name in files):
            raise error(f"{path}: has storage files ({files}) but no {METADATA_FILE} (an "
                        f"interrupted recording?); `ros2 bag reindex {path}` restores it")
        raise error(f"{path}: is not a rosbag2 directory: no {METADATA_FILE} (found "
                    f"{files or 'nothing'})")
    meta = bag_information(path, error)
    version = meta.get("version")
    if not isinstance(version, int) or version not in SUPPORTED_METADATA_VERSIONS:
        raise error(f"{path}: {METADATA_FILE} has version {version!r}; this reader (rosbags) "
                    f"reads versions {SUPPORTED_METADATA_VERSIONS.start}.."
                    f"{SUPPORTED_METADATA_VERSIONS.stop - 1}; convert the bag with "
                    f"`ros2 bag convert` of a ROS distribution that wrote it")
    storage = meta.get("storage_identifier")
    if storage not in SUPPORTED_STORAGES:
        raise error(f"{path}: storage plugin {storage!r} is not supported (only "
                    f"{list(SUPPORTED_STORAGES)}); convert with `ros2 bag convert`")
    entries = meta.get("topics_with_message_count") or []
    other = sorted({str(e.get("topic_metadata", {}).get("serialization_format"))
                    for e in entries if isinstance(e, dict)} - {"cdr"})
    if other:
        raise error(f"{path}: messages serialized as {other}; only cdr (ROS 2's default) is "
                    f"read")
    mode = str(meta.get("compression_mode") or "").lower()
    if mode not in ("", "none") and meta.get("compression_format") != "zstd":
        raise error(f"{path}: compression {meta.get('compression_format')!r} is not supported "
                    f"(only zstd)")
    files = storage_files(meta)
    missing = [f for f in files if not (path / f).is_file()]
    if missing:
        split = f"split over {len(files)} files" if len(files) > 1 else "made of 1 file"
        raise error(f"{path}: the bag is {split} ({files}) but {missing} are missing; copy "
                    f"every file of the bag, or reindex the parts present with "
                    f"`ros2 bag reindex {path}`")
    return meta


def joint_values(names: list[str], positions, gripper_joint: str = "gripper",
                 topic: str = "joint states") -> tuple[np.ndarray, float]:
    """(6 arm joint angles rad, gripper width m) of a JointState's names and positions.

    The arm joints are ``joint1``..``joint6`` when named so, else the first six positions.

    Raises:
        ValueError: no joint ``gripper_joint`` (the message lists the names it has and the
            option to choose one), or fewer than 6 arm joints.
    """
    from heisd_ros.data.episode import JOINT_STATE_NAMES

    names, pos = list(names), np.asarray(positions, dtype=np.float64)
    if gripper_joint not in names:
        raise ValueError(f"{topic}: no joint named {gripper_joint!r} for the gripper width "
                         f"(names {names}); choose it with --gripper-joint NAME (piper_ros "
                         f"publishes it as joint7)")
    arm = JOINT_STATE_NAMES[:6]
    if all(n in names for n in arm):
        joints = np.array([pos[names.index(n)] for n in arm])
    elif len(pos) >= 7:
        joints = np.array([p for n, p in zip(names, pos, strict=False)
                           if n != gripper_joint][:6])
    else:
        raise ValueError(f"{topic}: expected 6 arm joints and the gripper, got names {names}")
    return joints, float(pos[names.index(gripper_joint)])


def resolve_cameras(topics: dict[str, str | None], present: dict) -> dict[str, str | None]:
    """``topics`` with each unset (None) camera role resolved against the bag's topics.

    An unset camera takes its default topic or, when only that is in the bag (``present``:
    the bag's topics), the default's image_transport ``/compressed`` topic.
    """
    from heisd_ros.data.rosbag_io import COMPRESSED_SUFFIX

    defaults, out = BagTopics(), dict(topics)
    for role in ("primary", "wrist"):
        if role in out and out[role] is None:
            default = getattr(defaults, role)
            compressed = default + COMPRESSED_SUFFIX
            out[role] = (compressed if default not in present and compressed in present
                         else default)
    return out
