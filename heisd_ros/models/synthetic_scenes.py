"""Seeded synthetic observations: coloured blocks on a table, random instructions.

A stand-in observation source until the simulator's demonstrations exist: anything that
yields :class:`Observation` can replace it (training, bench). Scenes are reproducible from
``(seed, index)``. ``extras["goal_uv"]`` is the named block's centre in the primary image
(fractions of width/height) so scripted labels can be derived from the scene.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from heisd_ros.data.observation import Observation

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (200, 40, 40), "green": (40, 170, 60), "blue": (40, 70, 200),
    "yellow": (220, 200, 40), "purple": (140, 50, 160), "orange": (230, 120, 30)}
TEMPLATES = ("pick up the {c} block", "push the {c} block to the left",
             "put the {c} block on the plate", "move the {c} block forward",
             "stack the {c} block on the other block", "touch the {c} block")


@dataclass(frozen=True)
class SyntheticScenes:
    """An iterable of ``count`` seeded observations (two cameras, instruction, proprio).

    Attributes:
        count: observations yielded per iteration.
        seed: scene i is drawn from ``numpy.random.default_rng((seed, i))``.
        height_px, width_px: camera image size.
        proprio_dim: length of the proprio vector (0 = None).
    """

    count: int
    seed: int = 0
    height_px: int = 96
    width_px: int = 128
    proprio_dim: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.count, int) or self.count < 0:
            raise ValueError(f"count: expected an int >= 0, got {self.count!r}")
        if self.height_px < 16 or self.width_px < 16:
            raise ValueError(f"height_px/width_px: expected >= 16, "
                             f"got {self.height_px}x{self.width_px}")
        if self.proprio_dim < 0:
            raise ValueError(f"proprio_dim: expected >= 0, got {self.proprio_dim}")

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[Observation]:
        for i in range(self.count):
            yield self.scene(i)

    def describe(self) -> str:
        """One line for training cards and bench reports."""
        return (f"synthetic blocks scenes: count={self.count} seed={self.seed} "
                f"size={self.height_px}x{self.width_px}")

    def scene(self, index: int) -> Observation:
        """Observation number ``index`` (the same for the same seed, on any machine)."""
        rng = np.random.default_rng((self.seed, index))
        h, w = self.height_px, self.width_px
        table = rng.integers(90, 170, size=3)
        image = np.clip(table + rng.normal(0, 6, (h, w, 3)), 0, 255).astype(np.uint8)
        names = rng.choice(list(COLOURS), size=int(rng.integers(2, 5)), replace=False)
        centres = []
        for name in names:
            bh, bw = int(rng.integers(h // 10, h // 5)), int(rng.integers(w // 10, w // 5))
            top, left = int(rng.integers(0, h - bh)), int(rng.integers(0, w - bw))
            image[top:top + bh, left:left + bw] = COLOURS[name]
            centres.append(((left + bw / 2) / w, (top + bh / 2) / h))
        goal = int(rng.integers(len(names)))
        instruction = TEMPLATES[int(rng.integers(len(TEMPLATES)))].format(c=names[goal])
        wrist = self._wrist_view(image, centres[goal], rng)
        proprio = (rng.normal(0, 0.1, self.proprio_dim).astype(np.float32)
                   if self.proprio_dim else None)
        return Observation(image_primary=image, image_wrist=wrist, instruction=instruction,
                           proprio=proprio, stamp_s=float(index),
                           extras={"goal_uv": centres[goal], "goal_colour": str(names[goal])})

    @staticmethod
    def _wrist_view(image: np.ndarray, centre_uv, rng) -> np.ndarray:
        """A 2x zoom around a point near the goal block (what a wrist camera sees approaching)."""
        h, w = image.shape[:2]
        cu = np.clip(centre_uv[0] + rng.normal(0, 0.1), 0.25, 0.75)
        cv = np.clip(centre_uv[1] + rng.normal(0, 0.1), 0.25, 0.75)
        top, left = int(cv * h - h / 4), int(cu * w - w / 4)
        crop = image[top:top + h // 2, left:left + w // 2]
        return np.ascontiguousarray(crop.repeat(2, axis=0).repeat(2, axis=1))
