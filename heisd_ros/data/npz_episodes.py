"""The compact training format: one compressed ``.npz`` per episode.

Layout on disk::

    <root>/<suite>/<task>/episode_<seed:06d>.npz
    <root>/summary.json                      (heisd-collect: every run, merged)

Keys of each ``.npz`` (``np.savez_compressed``; read with ``allow_pickle=False``):

    format_version      int64 scalar, currently 1
    suite, task         str scalars
    instruction         str scalar
    seed                int64 scalar
    success             bool scalar
    control_rate_hz     float64 scalar
    image_third_person  (T, H, W, 3) uint8 RGB, observation t
    image_wrist         (T, H, W, 3) uint8 RGB, observation t
    joint_positions_rad (T, 6) float32
    gripper_width_m     (T,) float32
    ee_position_m       (T, 3) float32, flange in base_link
    ee_rpy_rad          (T, 3) float32, extrinsic XYZ
    ee_quat_xyzw        (T, 4) float32
    action              (T, 7) float32, command sent after observation t:
                        dx, dy, dz (m), droll, dpitch, dyaw (rad, fixed base axes), gripper
                        (1 = closed, 0 = open)
    stamp_s             (T,) float64, time of observation t
    step_success        (T,) bool, task predicate after command t
    metadata_json       str scalar, JSON object (simulator config, expert, ...)

Rendered frames are flat-shaded, so zip deflate shrinks them roughly 5-10x.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from heisd_ros.data.episode import EpisodeRecord
from heisd_ros.data.observation import Observation

FORMAT_VERSION = 1
_ARRAYS = ("image_third_person", "image_wrist", "joint_positions_rad", "gripper_width_m",
           "ee_position_m", "ee_rpy_rad", "ee_quat_xyzw", "action", "stamp_s", "step_success")


def episode_path(root: str | Path, suite: str, task: str, seed: int) -> Path:
    """Where the episode of (suite, task, seed) lives under ``root``."""
    return Path(root) / suite / task / f"episode_{int(seed):06d}.npz"


def save_episode(record: EpisodeRecord, path: str | Path) -> Path:
    """Write ``record`` to ``path``, creating parent directories.

    The file is written under a temporary name and then renamed, so a crash never leaves a
    truncated episode behind; an exception or interrupt while writing removes the temporary.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    arrays = {name: np.asarray(getattr(record, name)) for name in _ARRAYS}
    try:
        np.savez_compressed(
            tmp, format_version=np.int64(FORMAT_VERSION), suite=np.str_(record.suite),
            task=np.str_(record.task), instruction=np.str_(record.instruction),
            seed=np.int64(record.seed), success=np.bool_(record.success),
            control_rate_hz=np.float64(record.control_rate_hz),
            metadata_json=np.str_(json.dumps(record.metadata, sort_keys=True)), **arrays)
    except BaseException:  # an interrupt too: no half-written file is left behind
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    return path


def load_episode(path: str | Path) -> EpisodeRecord:
    """Read one episode; ValueError names the file and what is wrong with it."""
    path = Path(path)
    with np.load(path, allow_pickle=False) as npz:
        missing = sorted({"format_version", "suite", "task", "instruction", "seed", "success",
                          "control_rate_hz", "metadata_json", *_ARRAYS} - set(npz.files))
        if missing:
            raise ValueError(f"{path}: not a heisd episode file, missing keys {missing}")
        version = int(npz["format_version"])
        if version != FORMAT_VERSION:
            raise ValueError(f"{path}: format_version {version} is not supported "
                             f"(this reader handles {FORMAT_VERSION})")
        return EpisodeRecord(
            suite=str(npz["suite"]), task=str(npz["task"]), instruction=str(npz["instruction"]),
            seed=int(npz["seed"]), success=bool(npz["success"]),
            control_rate_hz=float(npz["control_rate_hz"]),
            metadata=json.loads(str(npz["metadata_json"])),
            **{name: npz[name] for name in _ARRAYS})


def iter_episode_paths(root: str | Path, suites: Iterable[str] | None = None,
                       tasks: Iterable[str] | None = None) -> list[Path]:
    """Sorted episode files under ``root``, optionally only of some suites / tasks."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"root: {root} is not a directory")
    wanted_suites, wanted_tasks = set(suites or ()), set(tasks or ())
    paths = []
    for path in sorted(root.glob("*/*/episode_*.npz")):
        if path.name.endswith(".tmp.npz"):
            continue
        if wanted_suites and path.parent.parent.name not in wanted_suites:
            continue
        if wanted_tasks and path.parent.name not in wanted_tasks:
            continue
        paths.append(path)
    return paths


def iter_steps(episode: EpisodeRecord | str | Path) -> Iterator[tuple[Observation, np.ndarray]]:
    """(Observation, action) per step of one episode; action is a float64 (7,) vector."""
    record = episode if isinstance(episode, EpisodeRecord) else load_episode(episode)
    for t in range(record.num_steps):
        yield record.observation(t), np.asarray(record.action[t], dtype=np.float64)


def iter_dataset(root: str | Path, suites: Iterable[str] | None = None,
                 tasks: Iterable[str] | None = None) -> Iterator[tuple[Observation, np.ndarray]]:
    """(Observation, action) over every step of every episode under ``root``."""
    for path in iter_episode_paths(root, suites, tasks):
        yield from iter_steps(path)
