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
