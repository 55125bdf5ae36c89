"""Episodes to view, as :class:`ViewStep` sequences: from a rosbag2 bag or an evaluation.

A bag is read with :func:`heisd_ros.data.bag_episodes.load_bag_episode` (``heisd-record``'s
bags and ``ros2 bag record`` bags of the live system alike, topics remappable); its
``/heisd/hybrid_step`` messages, when it has them, are paired with the steps by header stamp
(both carry the stamp of the frames a step was decided on). A command's age is its log time
less its header stamp: how old the frames were when the command was recorded (0 in
``heisd-record``'s bags, which log at the stamp).

An evaluation's episode is the :class:`~heisd_ros.data.episode.EpisodeRecord` its
:class:`~heisd_ros.eval.recording.EpisodeTape` kept plus the decoder's step records; in real
time a command's age is the world time from its frames to its landing.
"""

from __future__ import annotations

import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from heisd_ros.data.episode import EpisodeRecord

#: Frames and HybridSteps further apart in header stamp than this are not one step, ns.
PAIR_SKEW_NS = 1_000_000


@dataclass(frozen=True)
class ViewStep:
    """One step as a viewer logs it (see :meth:`heisd_ros.viewer.episode_log.EpisodeLog.step`)."""

    t_s: float
    joints_rad: np.ndarray
    gripper_m: float
    ee_position_m: np.ndarray
    fields: dict | None = None
    images: tuple | None = None
    command_age_ms: float | None = None


def record_steps(record: EpisodeRecord, fields: Sequence[dict | None] | None = None,
                 ages_ms: Sequence[float | None] | None = None) -> Iterator[ViewStep]:
    """The steps of ``record`` with their HybridStep ``fields`` and command ages, if known."""
    for t in range(record.num_steps):
        yield ViewStep(float(record.stamp_s[t]), record.joint_positions_rad[t],
                       float(record.gripper_width_m[t]), record.ee_position_m[t],
                       fields[t] if fields is not None else None,
                       (record.image_third_person[t], record.image_wrist[t]),
                       ages_ms[t] if ages_ms is not None else None)


def message_fields(msg) -> dict:
    """A HybridStep message's fields as plain values (no header, index or task).

    ``msg``: one read from a bag (a rosbags dataclass) or received by rclpy (its arrays come
    as ``array.array`` or numpy arrays).
    """
    names = (msg.get_fields_and_field_types() if hasattr(msg, "get_fields_and_field_types")
             else msg.__dataclass_fields__)
    out = {}
    for name in names:
        if name in ("header", "step_index", "task"):
            continue
        value = getattr(msg, name)
        if isinstance(value, np.ndarray):
            value = value.tolist()
        elif isinstance(value, (array.array, bytes, list, tuple)):
            value = list(value)
        out[name] = value
    return out


def _stamp_ns(header) -> int:
    return int(header.stamp.sec) * 1_000_000_000 + int(header.stamp.nanosec)


def _nearest(stamps_ns: np.ndarray, stamp_ns: int) -> int | None:
    if not len(stamps_ns):
        return None
    i = int(np.argmin(np.abs(stamps_ns - stamp_ns)))
    return i if abs(int(stamps_ns[i]) - stamp_ns) <= PAIR_SKEW_NS else None


def bag_steps(path: str | Path, topics=None, gripper_joint: str = "gripper",
              max_skew_s: float = 0.05) -> tuple[EpisodeRecord, list[ViewStep]]:
    """The episode of one bag and its steps (HybridStep fields where the bag has them).

    Raises ``BagEpisodeError`` (a ``ValueError`` naming the cause and the fix) for a bag
    that cannot be read as an episode.
    """
    from heisd_ros.data.bag_episodes import EpisodeTopics, load_bag_episode
    from heisd_ros.data.rosbag_io import metadata_topics, read_bag_messages
    from heisd_ros.eval.recording import TOPIC_HYBRID_STEP, make_recording_typestore

    topics = topics or EpisodeTopics()
    record = load_bag_episode(path, topics, max_skew_s=max_skew_s, gripper_joint=gripper_joint)
    stamps_ns = np.round(np.asarray(record.stamp_s) * 1e9).astype(np.int64)
    fields: list[dict | None] = [None] * record.num_steps
    ages: list[float | None] = [None] * record.num_steps
    present = metadata_topics(path)
    wanted = [t for t in (TOPIC_HYBRID_STEP, topics.ee_command) if t in present]
    for topic, log_ns, msg in read_bag_messages(path, wanted, make_recording_typestore()):
        t = _nearest(stamps_ns, _stamp_ns(msg.header))
        if t is None:
            continue
        if topic == TOPIC_HYBRID_STEP:
            fields[t] = message_fields(msg)
        elif ages[t] is None:
            ages[t] = (log_ns - _stamp_ns(msg.header)) / 1e6
    has_steps = any(f is not None for f in fields)
    return record, list(record_steps(record, fields if has_steps else None, ages))


def eval_steps(record: EpisodeRecord, stats: Sequence[dict]) -> list[ViewStep]:
    """An evaluation episode's steps: the tape's record and the decoder's step records."""
    from heisd_ros.eval.recording import hybrid_step_fields

    fields = [hybrid_step_fields(s) if "stage_ms" in s or s.get("hybrid") else None
              for s in stats]
    ages = [s.get("rt_world_latency_ms") for s in stats]
    if len(fields) != record.num_steps:
        raise ValueError(f"stats: expected {record.num_steps} step records, got {len(fields)}")
    return list(record_steps(record, fields, ages))
