"""Frames of any rosbag2 for open-loop replay: check the bag, pair cameras with robot state.

:func:`inspect_bag` fails with a :class:`BagError` whose message names the cause and the fix:
a missing path, a file, a folder of bags, storage files without metadata, a metadata version
or storage this reader cannot read, a split bag with missing parts, an empty, truncated or
corrupt storage file, and missing or mistyped topics (what was found, what is needed, which
``--topic-*`` option remaps it). The robot state is required: the model's proprioception
(EE pose and gripper width) and the router's EE position come from it, so a bag without
it stops unless :attr:`FrameOptions.without_state` says to replay without.

:func:`iter_frames` applies the pairing rule of every tool (:mod:`heisd_ros.data.pairing`):
each primary-camera frame (optionally thinned to a replay rate) takes the wrist frame nearest
in header stamp, earlier or later, within the camera tolerance, and the joint state and EE
pose nearest to it within the state tolerance. Frames that cannot be paired, or whose robot
state is not finite, are dropped and counted by reason in a
:class:`~heisd_ros.data.pairing.PairingReport`.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from heisd_ros.data.bag_topics import (
    ROLES,
    BagTopics,
    check_bag_dir,
    found_and_needed,
    joint_values,
    missing_topic,
    option,
    remap_hint,
    storage_files,
)
from heisd_ros.data.observation import Observation
from heisd_ros.data.pairing import (
    DEFAULT_PAIR_TOLERANCE_S,
    PairingReport,
    all_finite,
    nearest,
    thin_to_rate,
)
from heisd_ros.data.rosbag_io import READ_ERRORS, image_from_msg, make_typestore
from heisd_ros.geometry.rotations import matrix_to_rpy, quat_xyzw_to_matrix

#: The roles replay reads. Each camera may be an Image or a CompressedImage
#: (``ROLES[role].accepts``); '' disables the wrist camera (a robot without one).
REPLAY_ROLES = ("primary", "wrist", "joint_states", "ee_pose")
STATE_ROLES = ("joint_states", "ee_pose")
#: The policy node's default ``input.max_state_skew_s``: the largest |state - frame| stamp, s.
DEFAULT_STATE_TOLERANCE_S = 0.5


class BagError(ValueError):
    """A bag that cannot be replayed; the message is meant for the user as is."""


@dataclass(frozen=True)
class FrameOptions:
    """How frames are chosen and paired (see the module docstring).

    Attributes:
        pair_tolerance_s: largest stamp difference of the two camera frames, s.
        state_tolerance_s: largest stamp difference of a state message and the frame, s.
        rate_hz: replay at most this many primary frames per second (None: every frame).
        gripper_joint: the JointState name of the gripper width.
        without_state: replay without joint states and EE pose (no proprioception, no EE
            position for the router): every action may differ from the robot's.
    """

    pair_tolerance_s: float = DEFAULT_PAIR_TOLERANCE_S
    state_tolerance_s: float = DEFAULT_STATE_TOLERANCE_S
    rate_hz: float | None = None
    gripper_joint: str = "gripper"
    without_state: bool = False

    def __post_init__(self) -> None:
        for name in ("pair_tolerance_s", "state_tolerance_s"):
            value = getattr(self, name)
            if not (np.isfinite(value) and value >= 0):
                raise ValueError(f"{name}: expected a finite value >= 0 s, got {value!r}")
        if self.rate_hz is not None and not (np.isfinite(self.rate_hz) and self.rate_hz > 0):
            raise ValueError(f"rate_hz: expected > 0 Hz, got {self.rate_hz!r}")

    def roles(self, topics: BagTopics) -> dict[str, str]:
        """{role: topic} replay reads with these options."""
        return {role: topic for role, topic in topics.active(REPLAY_ROLES).items()
                if not (self.without_state and role in STATE_ROLES)}


@dataclass
class BagInfo:
    """What :func:`inspect_bag` found: the bag directory, its topics and custom data."""

    path: Path
    topics: dict[str, tuple[str, int]]
    files: list[str]
    storage: str
    custom_data: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def inspect_bag(path: str | Path, topics: BagTopics,
                options: FrameOptions = FrameOptions()) -> BagInfo:
    """Check that ``path`` is a readable rosbag2 with the topics replay needs (module doc)."""
    from rosbags.rosbag2 import Reader

    path = Path(path)
    meta = check_bag_dir(path, BagError)
    files = storage_files(meta)
    try:
        with Reader(path) as reader:
            found = {c.topic: (c.msgtype, c.msgcount) for c in reader.connections}
    except (*READ_ERRORS, ValueError, KeyError) as err:
        raise BagError(f"{path}: the storage file cannot be opened ({type(err).__name__}: "
                       f"{err}); it is probably truncated or corrupt (recording killed?). "
                       f"Storage {meta.get('storage_identifier')!r}, files {files}") from err
    info = BagInfo(path, found, files, str(meta.get("storage_identifier", "")),
                   dict(meta.get("custom_data") or {}))
    problems = []
    for role in REPLAY_ROLES:
        topic = getattr(topics, role)
        if role in STATE_ROLES and options.without_state:
            continue
        if not topic:
            if role in STATE_ROLES:
                problems.append(f"  {option(role)} is empty; the model's proprioception needs "
                                f"the {ROLES[role].help}")
            continue
        msgtypes = ROLES[role].accepts
        if topic not in found:
            problems.append(missing_topic(role, topic, msgtypes, ROLES[role].help))
        elif found[topic][0] not in msgtypes:
            problems.append(f"  {topic}: has type {found[topic][0]}, replay needs "
                            f"{' or '.join(msgtypes)}; {remap_hint(role)}")
        elif found[topic][1] == 0:
            problems.append(f"  {topic} ({found[topic][0]}): 0 messages")
    total = sum(n for _, n in found.values())
    if problems or total == 0:
        head = "the bag is empty (0 messages)" if total == 0 else "the bag cannot be replayed"
        raise BagError(
            f"{path}: {head}.\n" + found_and_needed(found, problems or ["  camera messages"])
            + "\nReplay needs the cameras (--topic-primary, --topic-wrist; '' for a robot "
              "without a wrist camera) and the robot state the model reads: "
              "sensor_msgs/msg/JointState with the gripper width (--topic-joint-states, "
              "--gripper-joint) and geometry_msgs/msg/PoseStamped of the EE "
              "(--topic-ee-pose); piper_ros publishes them as /joint_states_single (gripper "
              "joint7) and /end_pose_stamped. --without-state replays without them (every "
              "action may change).")
    if options.without_state:
        info.warnings.append("replayed --without-state: no joint states and EE pose, so the "
                             "model saw no proprioception and the router no EE position; "
                             "actions may differ from the robot's")
    return info


def _stamp_s(msg, log_ns: int) -> float:
    header = getattr(msg, "header", None)
    if header is not None and (header.stamp.sec or header.stamp.nanosec):
        return header.stamp.sec + header.stamp.nanosec * 1e-9
    return log_ns * 1e-9


@dataclass
class _Stream:
    """One role's messages by header stamp: stamps (s), and per message its value."""

    stamps: list[float] = field(default_factory=list)
    values: list = field(default_factory=list)

    def sorted(self) -> tuple[np.ndarray, list]:
        order = np.argsort(np.asarray(self.stamps, dtype=np.float64), kind="stable")
        return (np.asarray(self.stamps, dtype=np.float64)[order],
                [self.values[i] for i in order])


def _read_index(info: BagInfo, roles: dict[str, str], options: FrameOptions, ts
                ) -> tuple[dict[str, _Stream], Counter]:
    """First pass: every message's stamp; cameras by their place in the topic, state values."""
    from rosbags.rosbag2 import Reader

    streams: dict[str, _Stream] = defaultdict(_Stream)
    read: Counter = Counter()
    role_of = {topic: role for role, topic in roles.items()}
    with Reader(info.path) as reader:
        conns = [c for c in reader.connections if c.topic in role_of]
        for conn, log_ns, raw in reader.messages(connections=conns):
            role = role_of[conn.topic]
            msg = ts.deserialize_cdr(raw, conn.msgtype)
            if role == "ee_pose":
                p, q = msg.pose.position, msg.pose.orientation
                value = (np.array([p.x, p.y, p.z]),
                         matrix_to_rpy(quat_xyzw_to_matrix(np.array([q.x, q.y, q.z, q.w]))))
            elif role == "joint_states":
                try:
                    value = joint_values(msg.name, msg.position, options.gripper_joint,
                                         conn.topic)
                except ValueError as err:
                    raise BagError(f"{info.path}: {err}") from err
            else:
                value = read[conn.topic]  # the camera message's place in its topic
            streams[role].stamps.append(_stamp_s(msg, log_ns))
            streams[role].values.append(value)
            read[conn.topic] += 1
    return streams, read


@dataclass(frozen=True)
class _Plan:
    """One observation to emit: the frames' places in their topics and the robot state."""

    stamp_s: float
    primary: int
    wrist: int | None
    ee_pose: tuple | None
    joints: tuple | None


def _plan(streams: dict[str, _Stream], roles: dict[str, str], options: FrameOptions,
          report: PairingReport) -> list[_Plan]:
    """Apply the pairing rule to the first pass; count what is dropped and why."""
    primary_stamps, primary_seq = streams["primary"].sorted()
    kept = thin_to_rate(primary_stamps, options.rate_hz)
    report.considered = len(kept)
    others = {role: streams[role].sorted() for role in ("wrist", *STATE_ROLES) if role in roles}
    plans = []
    for i in kept:
        stamp = float(primary_stamps[i])
        chosen, reason = {}, ""
        for role, (stamps, values) in others.items():
            tolerance = (options.pair_tolerance_s if role == "wrist"
                         else options.state_tolerance_s)
            j = nearest(stamps, stamp, tolerance)
            if j is None:
                reason = f"no {roles[role]} message within {tolerance:g} s"
                break
            value = values[j]
            if role != "wrist" and not all_finite(value):
                reason = f"non-finite values on {roles[role]}"
                break
            chosen[role] = value
        if reason:
            report.drop(reason)
            continue
        plans.append(_Plan(stamp, primary_seq[i], chosen.get("wrist"), chosen.get("ee_pose"),
                           chosen.get("joint_states")))
    report.paired = len(plans)
    return plans


def _observation(plan: _Plan, index: int, instruction: str, primary: np.ndarray,
                 wrist: np.ndarray | None) -> Observation:
    proprio = joints = position = None
    if plan.ee_pose is not None and plan.joints is not None:
        position, rpy = plan.ee_pose
        joints, gripper = plan.joints
        proprio = np.concatenate([position, rpy, [gripper]])
    return Observation(image_primary=primary, image_wrist=wrist, instruction=instruction,
                       proprio=proprio, stamp_s=plan.stamp_s,
                       extras={"frame": index, "ee_position_m": position,
                               "joint_positions_rad": joints})


def iter_frames(info: BagInfo, topics: BagTopics, instruction: str,
                max_frames: int | None = None, options: FrameOptions = FrameOptions(),
                report: PairingReport | None = None) -> Iterator[Observation]:
    """Paired observations of the bag in stamp order (see the module docstring).

    Two passes over the bag: stamps and robot state first, then only the camera images
    some observation uses, decoded once each. ``report`` (filled in as the frames are read)
    counts the messages found per topic, the frames considered, paired and dropped by reason.

    Raises:
        BagError: a camera image the policy would refuse, a JointState without the gripper
            joint, a storage file that stops early, or no pairable frame (with the counts
            of what was found and why each frame was dropped).
    """
    report = report if report is not None else PairingReport()
    report.rate_hz = options.rate_hz
    roles = options.roles(topics)
    ts = make_typestore()
    try:
        streams, read = _read_index(info, roles, options, ts)
    except READ_ERRORS as err:
        raise BagError(f"{info.path}: reading stopped ({type(err).__name__}: {err}); the "
                       f"storage file is probably truncated") from err
    report.found = {topic: read[topic] for topic in roles.values()}
    listed = {topic: info.topics[topic][1] for topic in roles.values() if topic in info.topics}
    mismatch = {t: (n, read[t]) for t, n in listed.items() if read[t] != n}
    if mismatch:
        info.warnings.append("metadata.yaml does not match the storage file: " + ", ".join(
            f"{t} listed {n}, read {m}" for t, (n, m) in mismatch.items()))
    plans = _plan(streams, roles, options, report)
    if not plans:
        raise BagError(_no_frames_message(info, report, mismatch, options))
    yield from _emit(info, roles, plans, instruction, max_frames, ts)


def _no_frames_message(info: BagInfo, report: PairingReport, mismatch: dict,
                       options: FrameOptions) -> str:
    if mismatch and not any(report.found.values()):
        return (f"{info.path}: metadata.yaml does not match the storage file ("
                + ", ".join(f"{t}: listed {n}, read {m}" for t, (n, m) in mismatch.items())
                + f"); `ros2 bag reindex {info.path}` rebuilds the metadata from the storage")
    hints = []
    if any(r.startswith("no ") and "within" in r for r in report.dropped):
        hints.append(f"compare the header stamps of the topics, or widen --max-skew-s "
                     f"({options.pair_tolerance_s:g} s, cameras) or --max-state-skew-s "
                     f"({options.state_tolerance_s:g} s, robot state)")
    if any(r.startswith("non-finite") for r in report.dropped):
        hints.append("the robot state holds NaN or inf: fix the publisher (the policy node "
                     "refuses such a state too)")
    return f"{info.path}: no frame could be replayed; {report.line()}" + (
        "; " + "; ".join(hints) if hints else "")


def _emit(info: BagInfo, roles: dict[str, str], plans: list[_Plan], instruction: str,
          max_frames: int | None, ts) -> Iterator[Observation]:
    """Second pass: decode the used images in log order, yield observations in stamp order."""
    from rosbags.rosbag2 import Reader

    limit = len(plans) if max_frames is None else min(max_frames, len(plans))
    plans = plans[:limit]
    wanted = {"primary": {p.primary for p in plans},
              "wrist": {p.wrist for p in plans if p.wrist is not None}}
    last_use = {p.wrist: i for i, p in enumerate(plans) if p.wrist is not None}
    images: dict[tuple[str, int], np.ndarray] = {}
    role_of = {roles[r]: r for r in ("primary", "wrist") if r in roles}
    seen: Counter = Counter()
    done = 0
    try:
        with Reader(info.path) as reader:
            conns = [c for c in reader.connections if c.topic in role_of]
            for conn, _log_ns, raw in reader.messages(connections=conns):
                role, seq = role_of[conn.topic], seen[conn.topic]
                seen[conn.topic] += 1
                if seq not in wanted[role]:
                    continue
                try:
                    images[role, seq] = image_from_msg(ts.deserialize_cdr(raw, conn.msgtype))
                except ValueError as err:
                    raise BagError(f"{conn.topic}: {err}; convert the images to rgb8, bgr8 "
                                   f"or mono8, or jpeg/png CompressedImage (e.g. with "
                                   f"image_proc) before replaying") from err
                while done < limit and ("primary", plans[done].primary) in images and (
                        plans[done].wrist is None or ("wrist", plans[done].wrist) in images):
                    plan = plans[done]
                    wrist = images.get(("wrist", plan.wrist))
                    yield _observation(plan, done, instruction,
                                       images.pop(("primary", plan.primary)), wrist)
                    if plan.wrist is not None and last_use[plan.wrist] == done:
                        images.pop(("wrist", plan.wrist), None)
                    done += 1
                if done == limit:
                    return
    except READ_ERRORS as err:
        raise BagError(f"{info.path}: reading stopped after {done} frames ({err}); the bag is "
                       f"probably truncated") from err
