"""The demonstration steps a VLA trains on, in memory: cache, held-out split, per-step helpers.

To be fast on a CPU the images are resized once to the model's ``image_size_px`` and kept in
memory as uint8 (:class:`DemoCache`, saved as one ``.npz``). The steps of one episode are
contiguous and in order (``DemoCache.episode``), which :func:`episode_starts` and
:func:`gripper_change_steps` rely on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from heisd_ros.data.npz_episodes import iter_episode_paths, load_episode

CACHE_FORMAT = 1


@dataclass
class DemoCache:
    """All demonstration steps in memory, images already at the model's resolution.

    Attributes:
        images: (N, 2, S, S, 3) uint8, primary then wrist camera.
        proprio: (N, 7) float32 (``make_proprio`` layout).
        actions: (N, 7) float32 physical actions (m, rad, gripper 0/1).
        episode: (N,) int64 index into ``episode_names``.
        episode_names: "suite/task/seed" of each episode.
        episode_instructions: instruction of each episode.
        source: where the episodes came from (for the card).
    """

    images: np.ndarray
    proprio: np.ndarray
    actions: np.ndarray
    episode: np.ndarray
    episode_names: list[str]
    episode_instructions: list[str]
    source: str

    @property
    def episode_suites(self) -> np.ndarray:
        """(episodes,) str: each episode's suite, the first part of its name."""
        return np.array([name.split("/", 1)[0] for name in self.episode_names])

    @property
    def image_size_px(self) -> int:
        """Side S of the cached images."""
        return int(self.images.shape[2])

    def save(self, path) -> Path:
        """Write the cache as an uncompressed ``.npz`` (fast to reload)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez(tmp, format=np.int64(CACHE_FORMAT), images=self.images, proprio=self.proprio,
                 actions=self.actions, episode=self.episode,
                 episode_names=np.array(self.episode_names),
                 episode_instructions=np.array(self.episode_instructions),
                 source=np.str_(self.source))
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path) -> DemoCache:
        """Read a cache written by :meth:`save`."""
        with np.load(path, allow_pickle=False) as npz:
            if int(npz["format"]) != CACHE_FORMAT:
                raise ValueError(f"{path}: demo cache format {int(npz['format'])}, "
                                 f"expected {CACHE_FORMAT}")
            return cls(images=npz["images"], proprio=npz["proprio"], actions=npz["actions"],
                       episode=npz["episode"], episode_names=npz["episode_names"].tolist(),
                       episode_instructions=npz["episode_instructions"].tolist(),
                       source=str(npz["source"]))


def resize_images(images: np.ndarray, size_px: int) -> np.ndarray:
    """(T, H, W, 3) uint8 -> (T, S, S, 3) uint8 with the vision encoder's resampling."""
    x = torch.as_tensor(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float() / 255.0
    if x.shape[-2:] != (size_px, size_px):
        x = F.interpolate(x, size=(size_px, size_px), mode="bilinear", antialias=True,
                          align_corners=False)
    return (x * 255.0).round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()


def build_demo_cache(root, image_size_px: int, suites=None,
                     progress: Callable[[int], None] | None = None) -> DemoCache:
    """Load every npz episode under ``root`` and resize its images to ``image_size_px``.

    The images are written into one array sized from a first pass over the episodes' action
    arrays, so building needs the cache's memory once, not twice (a 10 GB cache would
    otherwise peak at 20 GB and keep most of it as freed-but-mapped heap).
    """
    from heisd_ros.data.episode import make_proprio

    paths = iter_episode_paths(root, suites)
    if not paths:
        raise ValueError(f"root: no episode_*.npz files under {root}")
    lengths = []
    for path in paths:
        with np.load(path, allow_pickle=False) as npz:
            lengths.append(len(npz["action"]) if "action" in npz.files else 0)
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    images = np.empty((int(starts[-1]), 2, image_size_px, image_size_px, 3), np.uint8)
    proprio, actions, episode, names, instructions = [], [], [], [], []
    for index, path in enumerate(paths):
        record = load_episode(path)  # raises on a malformed file, naming it
        if record.num_steps != lengths[index]:
            raise ValueError(f"{path}: {record.num_steps} steps, but its action array has "
                             f"{lengths[index]}")
        span = slice(starts[index], starts[index + 1])
        images[span, 0] = resize_images(record.image_third_person, image_size_px)
        images[span, 1] = resize_images(record.image_wrist, image_size_px)
        proprio.append(np.stack([make_proprio(record.ee_position_m[t], record.ee_rpy_rad[t],
                                              record.gripper_width_m[t])
                                 for t in range(record.num_steps)]).astype(np.float32))
        actions.append(np.asarray(record.action, dtype=np.float32))
        episode.append(np.full(record.num_steps, index, dtype=np.int64))
        names.append(f"{record.suite}/{record.task}/{record.seed}")
        instructions.append(record.instruction)
        if progress is not None:
            progress(1)
    return DemoCache(images, np.concatenate(proprio), np.concatenate(actions),
                     np.concatenate(episode), names, instructions, str(root))


def split_episodes(cache: DemoCache, heldout_per_task: int) -> tuple[np.ndarray, np.ndarray]:
    """(train step indices, validation step indices): the last seeds of every task held out."""
    by_task: dict[str, list[tuple[int, int]]] = {}
    for index, name in enumerate(cache.episode_names):
        task, seed = name.rsplit("/", 1)
        by_task.setdefault(task, []).append((int(seed), index))
    heldout = set()
    for episodes in by_task.values():
        if len(episodes) <= heldout_per_task:
            raise ValueError(f"heldout_per_task: {heldout_per_task} leaves no training "
                             f"episode for a task with {len(episodes)}")
        heldout.update(index for _, index in sorted(episodes)[len(episodes) - heldout_per_task:])
    is_val = np.isin(cache.episode, sorted(heldout))
    return np.nonzero(~is_val)[0], np.nonzero(is_val)[0]


def episode_starts(episode: np.ndarray) -> np.ndarray:
    """First step of each episode; ``episode`` holds contiguous, ordered runs of one index."""
    return np.r_[0, np.nonzero(np.diff(np.asarray(episode)))[0] + 1]


def gripper_change_steps(gripper: np.ndarray, episode: np.ndarray, span: int) -> np.ndarray:
    """(N,) bool: each step where the gripper label changes, and the ``span - 1`` after it.

    Inputs are per step: the gripper label (0/1 or its bin) and the episode index; a change
    is only counted within one episode.
    """
    gripper, episode = np.asarray(gripper), np.asarray(episode)
    change = np.zeros(len(gripper), dtype=bool)
    change[1:] = (gripper[1:] != gripper[:-1]) & (episode[1:] == episode[:-1])
    marked = change.copy()
    for lag in range(1, span):
        later = np.zeros_like(change)
        later[lag:] = change[:-lag] & (episode[lag:] == episode[:-lag])
        marked |= later
    return marked
