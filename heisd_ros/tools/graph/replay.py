"""The observations ``heisd-bench graph`` plays as a robot's inputs, one per camera frame.

From the demonstrations of a DB (its held-out episodes, or ``--demos``) of one task, else
seeded synthetic scenes with the emulated arm's start pose as a constant robot state.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

SYNTHETIC_INSTRUCTION = "put the red block on the plate"
#: Robot state of the synthetic fallback: the emulated arm's start pose (flange, m / rad).
SYNTHETIC_POSE = (0.235, 0.0, 0.432, 0.0, 0.0, 0.0)
JOINT_NAMES = ("joint1", "joint2", "joint3", "joint4", "joint5", "joint6", "gripper")


@dataclass
class Replay:
    """Observations to play, one per camera frame, looped.

    Attributes:
        third, wrist: per observation (S, S, 3) uint8 RGB as published.
        states: (N, 13) joints (6, rad), gripper width (m), EE position (3, m), rpy (3, rad).
        episode: (N,) which replayed episode each observation belongs to.
        instruction, task: what the policy is told ("" task: the instruction is the key).
        description, image_note: for the report.
    """

    third: list = field(default_factory=list)
    wrist: list = field(default_factory=list)
    states: np.ndarray | None = None
    episode: np.ndarray | None = None
    instruction: str = SYNTHETIC_INSTRUCTION
    task: str = ""
    description: str = ""
    image_note: str = ""

    def __len__(self) -> int:
        return len(self.third)


def _resize(rgb: np.ndarray, px: int) -> np.ndarray:
    if px <= 0 or rgb.shape[:2] == (px, px):
        return np.ascontiguousarray(rgb)
    from PIL import Image as PILImage

    return np.array(PILImage.fromarray(rgb).resize((px, px), PILImage.BILINEAR))


def load_replay(args) -> Replay:
    """The demonstrations of ``--db`` (or ``--demos``), else seeded synthetic scenes."""
    replay, rows, episodes, sizes = Replay(), [], [], set()

    def add(obs, ep: int, proprio=None) -> None:
        sizes.add(obs.image_primary.shape[:2])
        replay.third.append(_resize(obs.image_primary, args.image_px))
        replay.wrist.append(_resize(obs.image_wrist, args.image_px))
        joints = obs.extras.get("joint_positions_rad", np.zeros(6))
        p = obs.proprio if proprio is None else proprio
        rows.append(np.concatenate([joints, [p[6]], p[:3], p[3:6]]))
        episodes.append(ep)

    if args.db:
        from heisd_ros.data.npz_episodes import iter_episode_paths
        from heisd_ros.tools._common import episode_loader, recorded_episodes

        offline = json.loads((Path(args.db) / "offline_stats.json").read_text(encoding="utf-8"))
        key = "held_out_episodes" if offline.get("held_out_episodes") else "db_episodes"
        paths = (iter_episode_paths(args.demos) if args.demos
                 else recorded_episodes(offline, key, "--demos"))
        load = episode_loader(offline)
        used = 0
        for path in paths:
            record = load(path)
            replay.task = replay.task or args.task or record.task
            if record.task != replay.task:
                continue
            replay.instruction = record.instruction
            for t in range(record.num_steps):
                add(record.observation(t), used)
                if len(replay) >= args.observations:
                    break
            used += 1
            if len(replay) >= args.observations:
                break
        if not len(replay):
            raise ValueError(f"no demonstration of task {replay.task!r} in "
                             f"{args.demos or key + ' of ' + args.db}")
        replay.description = (f"{len(replay)} observations of {used} demonstrations of task "
                              f"{replay.task!r} ({args.demos or key} of {args.db})")
    else:
        from heisd_ros.models.synthetic_scenes import SyntheticScenes

        proprio = np.asarray([*SYNTHETIC_POSE, 0.07], np.float32)
        for obs in SyntheticScenes(args.observations, seed=args.seed):
            add(obs, 0, proprio)
        replay.description = (f"{len(replay)} synthetic scenes (seed {args.seed}), instruction "
                              f"{SYNTHETIC_INSTRUCTION!r}, constant robot state")
    replay.states, replay.episode = np.asarray(rows, np.float64), np.asarray(episodes)
    recorded = ", ".join(f"{h}x{w}" for h, w in sorted(sizes))
    replay.image_note = (f"{recorded} px as recorded" if args.image_px <= 0
                         else f"{args.image_px}x{args.image_px} px, resized from {recorded}")
    return replay


def state_messages(state: np.ndarray, frame_id: str = "base_link"):
    """(JointState, PoseStamped) of one replay state row, headers without stamp."""
    from geometry_msgs.msg import PoseStamped
    from sensor_msgs.msg import JointState

    from heisd_ros.geometry.rotations import rpy_to_quat_xyzw as rpy_to_quaternion

    joint = JointState(name=list(JOINT_NAMES), position=[float(v) for v in state[:7]])
    pose = PoseStamped()
    pose.header.frame_id = frame_id
    p, o = pose.pose.position, pose.pose.orientation
    p.x, p.y, p.z = (float(v) for v in state[7:10])
    o.x, o.y, o.z, o.w = rpy_to_quaternion(state[10:13])
    return joint, pose
