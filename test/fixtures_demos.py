"""Synthetic demonstrations in the npz layout heisd-build-db reads.

``test/conftest.py`` writes the shared ``demos`` directory with :func:`write_demos`; tests
that need an episode of their own call :func:`synth_episode`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from heisd_ros.data.episode import EpisodeRecord
from heisd_ros.data.npz_episodes import episode_path, save_episode
from test.fixtures_decoding import scenes

#: Control steps of each synthetic episode.
T_STEPS = 8
#: The tasks of the episodes :func:`write_demos` writes (suite ``suite_a``), in order.
DEMO_TASKS = ("task_a", "task_a", "task_b")


def synth_episode(task: str, seed: int, steps: int = T_STEPS) -> EpisodeRecord:
    """A demonstration in the documented npz layout: a straight EE path, scene images."""
    obs = scenes(steps, seed=seed)
    rng = np.random.default_rng(seed)
    ee = np.array([0.3, 0.0, 0.2]) + np.outer(np.arange(steps), [0.01, 0.002, -0.003])
    action = np.concatenate([np.diff(ee, axis=0, append=ee[-1:] + [0.01, 0.002, -0.003]),
                             rng.normal(0, 0.02, (steps, 3)),
                             (np.arange(steps) >= steps // 2)[:, None]], axis=1)
    return EpisodeRecord(
        suite="suite_a", task=task, instruction=obs[0].instruction, seed=seed, success=True,
        control_rate_hz=10.0,
        image_third_person=np.stack([o.image_primary for o in obs]),
        image_wrist=np.stack([o.image_wrist for o in obs]),
        joint_positions_rad=np.zeros((steps, 6), np.float32),
        gripper_width_m=np.full(steps, 0.05, np.float32),
        ee_position_m=ee.astype(np.float32), ee_rpy_rad=np.zeros((steps, 3), np.float32),
        ee_quat_xyzw=np.tile([0, 0, 0, 1], (steps, 1)).astype(np.float32),
        action=action.astype(np.float32), stamp_s=np.arange(steps) * 0.1,
        step_success=np.zeros(steps, bool))


def write_demos(root: Path) -> Path:
    """Three episodes under ``root`` (two of ``task_a``, one of ``task_b``); returns ``root``."""
    for i, task in enumerate(DEMO_TASKS):
        save_episode(synth_episode(task, 40 + i), episode_path(root, "suite_a", task, i))
    return root
