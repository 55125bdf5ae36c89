"""Demonstration episodes from rosbag2 recordings (MCAP or sqlite3), as :class:`EpisodeRecord`.

A bag holds the robot's topics (see :mod:`heisd_ros.data.rosbag_io`): two camera images,
``/joint_states``, ``/ee_pose`` and the EE commands ``/heisd/ee_command``. Bags written by
``heisd-record`` / ``heisd-collect`` and bags of the live system taken with ``ros2 bag record``
both work; other topic names are remapped with :class:`EpisodeTopics` (``--topic-*``, the
roles of :mod:`heisd_ros.data.bag_topics`).

Steps are defined by the EE commands: a command's header stamp is the stamp of the
observation it was decided on (EECommand.msg), so step t pairs command t with the primary
camera frame nearest in header stamp, the wrist frame, joint state and EE pose nearest to
that frame, each within ``max_skew_s``. A command without a matching frame is dropped and
counted in ``metadata["dropped_commands"]``; a second command on the same frame likewise.

What a bag does not carry is filled in: ``ee_rpy_rad`` from the pose quaternion,
``control_rate_hz`` from the median stamp step, ``step_success`` False except the last step
(= the episode's success). Suite, task, instruction, seed and success come from the bag's
``heisd.*`` custom data when present, else from the caller (``--bag-task`` ...).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from heisd_ros.data.bag_topics import (
    METADATA_FILE,
    ROLES,
    BagTopics,
    bag_information,
    check_bag_dir,
    found_and_needed,
    joint_values,
    missing_topic,
    remap_hint,
)
from heisd_ros.data.episode import EpisodeRecord
from heisd_ros.data.pairing import all_finite, nearest
from heisd_ros.data.rosbag_io import READ_ERRORS, image_from_msg, make_typestore
from heisd_ros.geometry.rotations import quat_xyzw_to_rpy

#: The roles an episode reads (all of :data:`~heisd_ros.data.bag_topics.ROLES`); of these,
#: only ``joint_states`` may be disabled with ''.
EPISODE_ROLES = ("primary", "wrist", "joint_states", "ee_pose", "ee_command")
EPISODE_OPTIONAL = ("joint_states",)


class BagEpisodeError(ValueError):
    """A bag that cannot be turned into an episode; the message is meant for the user."""


@dataclass(frozen=True)
class EpisodeTopics(BagTopics):
    """Topic of each role; ``joint_states`` may be '' (joint angles 0, gripper width 0)."""

    def __post_init__(self) -> None:
        self.require(r for r in EPISODE_ROLES if r not in EPISODE_OPTIONAL)


@dataclass(frozen=True)
class EpisodeDefaults:
    """Identity of a bag without ``heisd.*`` custom data (e.g. from ``ros2 bag record``).

    ``task`` is required then; ``instruction`` defaults to the task, ``suite`` to "default".
    Values given here override the bag's custom data.
    """

    suite: str | None = None
    task: str | None = None
    instruction: str | None = None


def is_bag(path: str | Path) -> bool:
    """Whether ``path`` is a rosbag2 directory (holds metadata.yaml)."""
    return (Path(path) / METADATA_FILE).is_file()


def find_bags(root: str | Path) -> list[Path]:
    """``root`` itself if it is a bag, else every bag directory below it, sorted."""
    root = Path(root)
    if not root.is_dir():
        raise BagEpisodeError(f"{root}: not a directory")
    if is_bag(root):
        return [root]
    bags = sorted(p.parent for p in root.rglob(METADATA_FILE))
    if not bags:
        check_bag_dir(root, BagEpisodeError)  # says what the folder holds instead
    return bags


def bag_custom_data(path: str | Path) -> dict[str, str]:
    """The bag's ``custom_data`` from metadata.yaml ({} when absent)."""
    info = bag_information(path, BagEpisodeError)
    return {str(k): str(v) for k, v in (info.get("custom_data") or {}).items()}


def bag_identity(path: str | Path, defaults: EpisodeDefaults = EpisodeDefaults()) -> dict:
    """suite, task, instruction, seed, success of a bag (custom data, then ``defaults``)."""
    custom = bag_custom_data(path)
    task = defaults.task or custom.get("heisd.task")
    if not task:
        raise BagEpisodeError(f"{path}: the bag names no task (no heisd.task custom data, as "
                              f"heisd-record and heisd-collect write); pass --bag-task NAME "
                              f"(and --bag-instruction TEXT, --bag-suite NAME)")
    try:
        seed = int(custom.get("heisd.seed", 0))
    except ValueError:
        seed = 0
    return {"suite": defaults.suite or custom.get("heisd.suite") or "default", "task": task,
            "instruction": defaults.instruction or custom.get("heisd.instruction") or task,
            "seed": seed, "success": custom.get("heisd.success", "true").lower() != "false"}


def check_topics(path: Path, found: dict[str, tuple[str, int]], topics: EpisodeTopics) -> None:
    """Raise :class:`BagEpisodeError` naming what was found and needed, and the remaps."""
    problems = []
    for role, topic in topics.active(EPISODE_ROLES).items():
        accepts = ROLES[role].accepts  # cameras: Image or CompressedImage (jpeg/png)
        if topic not in found:
            problems.append(missing_topic(role, topic, accepts))
        elif found[topic][0] not in accepts:
            problems.append(f"  {topic} for {role}: has type {found[topic][0]}, needs "
                            f"{' or '.join(accepts)}; {remap_hint(role)}")
        elif found[topic][1] == 0:
            problems.append(f"  {topic} ({found[topic][0]}) for {role}: 0 messages")
    if problems:
        raise BagEpisodeError(
            f"{path}: cannot build an episode from this bag.\n{found_and_needed(found, problems)}"
            "\nAn episode needs both cameras, the EE pose and the EE commands "
            "(--topic-joint-states '' drops the joint states).")


def _stamp_ns(msg, log_ns: int) -> int:
    stamp = msg.header.stamp
    return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec) or int(log_ns)


def _read_first_pass(reader, roles: dict[str, str], ts, gripper_joint: str = "gripper"
                     ) -> dict[str, list]:
    """Per role [(header stamp ns, item)] by stamp; camera items are None (stamps only)."""
    out: dict[str, list] = {role: [] for role in roles.values()}
    conns = [c for c in reader.connections if c.topic in roles]
    for conn, log_ns, raw in reader.messages(connections=conns):
        role = roles[conn.topic]
        msg = ts.deserialize_cdr(raw, conn.msgtype)
        if role in ("primary", "wrist"):
            item = None
        elif role == "ee_command":
            if int(msg.mode) != 0:
                raise BagEpisodeError(f"{conn.topic}: command {msg.step_index} has mode "
                                      f"{msg.mode}; only MODE_DELTA (0) commands are actions "
                                      f"a VLA takes")
            t, r = msg.translation_m, msg.rotation_rad
            item = np.array([t.x, t.y, t.z, r.x, r.y, r.z, float(msg.gripper)])
        elif role == "ee_pose":
            p, q = msg.pose.position, msg.pose.orientation
            item = (np.array([p.x, p.y, p.z]), np.array([q.x, q.y, q.z, q.w]))
        else:
            try:
                item = joint_values(msg.name, msg.position, gripper_joint, conn.topic)
            except ValueError as err:
                raise BagEpisodeError(str(err)) from err
        out[role].append((_stamp_ns(msg, log_ns), item))
    for items in out.values():
        items.sort(key=lambda x: x[0])   # stable: equal stamps keep log order
    return out


def _pair(data: dict[str, list], skew_ns: int,
          topics: dict[str, str] | None = None) -> tuple[list[dict[str, int]], Counter]:
    """Per usable command: indices (into ``data``) of it and its frames, state and pose.

    The second value counts the dropped commands by reason (the pairing rule of
    :mod:`heisd_ros.data.pairing`; a state with NaN or inf is no demonstration either).
    """
    topics = topics or {}
    stamps = {role: np.array([s for s, _ in items], dtype=np.int64)
              for role, items in data.items()}
    steps, used, dropped = [], set(), Counter()
    skew_s = skew_ns * 1e-9
    for index, (stamp, action) in enumerate(data["ee_command"]):
        primary = nearest(stamps["primary"], stamp, skew_ns)
        if primary is None:
            dropped[f"no {topics.get('primary', 'primary')} frame within {skew_s:g} s"] += 1
            continue
        if primary in used:
            dropped["a second command on one frame"] += 1
            continue
        if not all_finite([action]):
            dropped[f"non-finite values on {topics.get('ee_command', 'ee_command')}"] += 1
            continue
        at = int(stamps["primary"][primary])
        step, reason = {"command": index, "primary": primary}, ""
        for role in ("wrist", "ee_pose", "joint_states"):
            step[role] = nearest(stamps[role], at, skew_ns) if role in stamps else -1
            if step[role] is None:
                reason = f"no {topics.get(role, role)} message within {skew_s:g} s"
            elif role != "wrist" and step[role] >= 0 and not all_finite(data[role][step[role]][1]):
                reason = f"non-finite values on {topics.get(role, role)}"
            if reason:
                break
        if reason:
            dropped[reason] += 1
            continue
        used.add(primary)
        steps.append(step)
    steps.sort(key=lambda s: int(stamps["primary"][s["primary"]]))
    return steps, dropped


def _read_images(reader, roles: dict[str, str], ts,
                 wanted: dict[str, set[int]]) -> dict[str, dict[int, np.ndarray]]:
    """Second pass: decode only the camera frames (by header stamp) some step uses."""
    images: dict[str, dict[int, np.ndarray]] = {role: {} for role in wanted}
    conns = [c for c in reader.connections if roles.get(c.topic) in wanted]
    for conn, log_ns, raw in reader.messages(connections=conns):
        role = roles[conn.topic]
        msg = ts.deserialize_cdr(raw, conn.msgtype)
        stamp = _stamp_ns(msg, log_ns)
        if stamp in wanted[role] and stamp not in images[role]:
            try:
                images[role][stamp] = image_from_msg(msg)
            except ValueError as err:
                raise BagEpisodeError(f"{conn.topic}: {err}; convert the images to rgb8, "
                                      f"bgr8, mono8 or jpeg/png CompressedImage (e.g. with "
                                      f"image_proc) first") from err
    return images


def load_bag_episode(path: str | Path, topics: EpisodeTopics = EpisodeTopics(),
                     defaults: EpisodeDefaults = EpisodeDefaults(),
                     max_skew_s: float = 0.05, gripper_joint: str = "gripper") -> EpisodeRecord:
    """Read one bag into an :class:`EpisodeRecord` (see the module docstring).

    ``gripper_joint`` is the JointState name of the gripper width (piper_ros: joint7).

    Raises:
        BagEpisodeError: naming the cause and the fix (not a bag, metadata this reader
            cannot read, missing topics, a JointState without the gripper joint, images
            the policy refuses or whose size changes mid-bag, a truncated storage file).
    """
    from rosbags.rosbag2 import Reader

    path = Path(path)
    check_bag_dir(path, BagEpisodeError)
    identity = bag_identity(path, defaults)
    roles = {topic: role for role, topic in topics.active(EPISODE_ROLES).items()}
    ts = make_typestore()
    try:
        with Reader(path) as reader:
            found = {c.topic: (c.msgtype, c.msgcount) for c in reader.connections}
            check_topics(path, found, topics)
            data = _read_first_pass(reader, roles, ts, gripper_joint)
            unread = {t: n for t, (_, n) in found.items()
                      if t in roles and n and not data[roles[t]]}
            if unread:
                raise BagEpisodeError(
                    f"{path}: metadata.yaml does not match the storage file (it lists "
                    + ", ".join(f"{n} messages on {t}" for t, n in unread.items())
                    + f", the storage holds none); `ros2 bag reindex {path}` rebuilds it")
            steps, dropped = _pair(data, int(round(max_skew_s * 1e9)),
                                   {role: topic for topic, role in roles.items()})
            if not steps:
                why = "; ".join(f"{n} {reason}" for reason, n in dropped.most_common())
                raise BagEpisodeError(
                    f"{path}: none of the {len(data['ee_command'])} EE commands on "
                    f"{topics.ee_command} could be paired ({why}); a command carries the "
                    f"stamp of the observation it was decided on: check the topics' stamps, "
                    f"or raise --max-skew-s")
            wanted = {role: {data[role][s[role]][0] for s in steps}
                      for role in ("primary", "wrist")}
            images = _read_images(reader, roles, ts, wanted)
    except READ_ERRORS as err:  # the metadata passed check_bag_dir: the storage is at fault
        raise BagEpisodeError(f"{path}: the bag cannot be read ({type(err).__name__}: {err}); "
                              f"the storage file is probably truncated or corrupt") from err
    return _record(path, identity, topics, data, images, steps, dropped)


def _record(path: Path, identity: dict, topics: EpisodeTopics, data: dict, images: dict,
            steps: list[dict[str, int]], dropped: Counter) -> EpisodeRecord:
    n = len(steps)
    frame = {role: [data[role][s[role]][0] for s in steps] for role in ("primary", "wrist")}
    stamps_s = np.array(frame["primary"], dtype=np.float64) * 1e-9
    joints, gripper = np.zeros((n, 6)), np.zeros(n)
    if "joint_states" in data:
        for t, s in enumerate(steps):
            joints[t], gripper[t] = data["joint_states"][s["joint_states"]][1]
    positions = np.array([data["ee_pose"][s["ee_pose"]][1][0] for s in steps])
    quats = np.array([data["ee_pose"][s["ee_pose"]][1][1] for s in steps])
    step_success = np.zeros(n, bool)
    step_success[-1] = identity["success"]
    rate = float(1.0 / np.median(np.diff(stamps_s))) if n > 1 else 0.0
    for role, topic in (("primary", topics.primary), ("wrist", topics.wrist)):
        _same_size(path, topic, [images[role][st] for st in frame[role]])
    return EpisodeRecord(
        suite=identity["suite"], task=identity["task"], instruction=identity["instruction"],
        seed=identity["seed"], success=identity["success"], control_rate_hz=rate,
        image_third_person=np.stack([images["primary"][s] for s in frame["primary"]]),
        image_wrist=np.stack([images["wrist"][s] for s in frame["wrist"]]),
        joint_positions_rad=joints.astype(np.float32), gripper_width_m=gripper.astype(np.float32),
        ee_position_m=positions.astype(np.float32),
        ee_rpy_rad=np.array([quat_xyzw_to_rpy(q) for q in quats], dtype=np.float32),
        ee_quat_xyzw=quats.astype(np.float32),
        action=np.array([data["ee_command"][s["command"]][1] for s in steps], dtype=np.float32),
        stamp_s=stamps_s, step_success=step_success,
        metadata={"source": "rosbag2", "bag": str(path), "topics": topics.active(EPISODE_ROLES),
                  "dropped_commands": sum(dropped.values()),
                  "dropped_reasons": dict(dropped)})


def _same_size(path: Path, topic: str, frames: list[np.ndarray]) -> None:
    """Raise :class:`BagEpisodeError` naming the first step where a camera's size changes."""
    sizes = [f.shape[:2] for f in frames]
    for t, size in enumerate(sizes):
        if size != sizes[0]:
            (h0, w0), (h, w) = sizes[0], size
            raise BagEpisodeError(
                f"{path}: {topic} changes resolution mid-bag: {w0}x{h0} up to step {t - 1}, "
                f"{w}x{h} at step {t}; an episode needs one camera resolution (record again "
                f"with a fixed camera mode, or split the bag with `ros2 bag convert`)")


def iter_bag_paths(root: str | Path, suites: Iterable[str] | None = None,
                   tasks: Iterable[str] | None = None,
                   defaults: EpisodeDefaults = EpisodeDefaults(),
                   skipped: list[tuple[Path, str]] | None = None) -> list[Path]:
    """Bags under ``root`` (or ``root`` itself), optionally only of some suites / tasks.

    A bag whose identity cannot be read raises, or with ``skipped`` is left out and
    appended there as (path, reason).
    """
    wanted_suites, wanted_tasks = set(suites or ()), set(tasks or ())
    out = []
    for path in find_bags(root):
        if wanted_suites or wanted_tasks:
            try:
                identity = bag_identity(path, defaults)
            except BagEpisodeError as err:
                if skipped is None:
                    raise
                skipped.append((path, str(err)))
                continue
            if wanted_suites and identity["suite"] not in wanted_suites:
                continue
            if wanted_tasks and identity["task"] not in wanted_tasks:
                continue
        out.append(path)
    return out


def load_any_episode(path: str | Path, topics: EpisodeTopics = EpisodeTopics(),
                     defaults: EpisodeDefaults = EpisodeDefaults(),
                     max_skew_s: float = 0.05, gripper_joint: str = "gripper") -> EpisodeRecord:
    """An npz episode file or a rosbag2 directory (e.g. the held-out list of offline stats)."""
    if Path(path).is_dir():
        return load_bag_episode(path, topics, defaults, max_skew_s, gripper_joint)
    from heisd_ros.data.npz_episodes import load_episode

    return load_episode(path)
