"""Writing an episode's steps to a ``.rrd`` file (``heisd-view --save``, ``heisd-eval --view``)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from heisd_ros.viewer.episode_log import EpisodeLog
from heisd_ros.viewer.sources import ViewStep


def log_steps(log: EpisodeLog, steps: Iterable[ViewStep]) -> EpisodeLog:
    """Log every step to ``log``; returns it."""
    for s in steps:
        log.step(s.t_s, joints_rad=s.joints_rad, gripper_m=s.gripper_m,
                 ee_position_m=s.ee_position_m, fields=s.fields, images=s.images,
                 command_age_ms=s.command_age_ms)
    return log


def write_episode(path: str | Path, name: str, steps: Iterable[ViewStep]) -> EpisodeLog:
    """One recording named ``name`` with ``steps``, written to ``path`` (folders made)."""
    from heisd_ros.viewer.output import Output, open_recording

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    recording, _ = open_recording(Output(save=str(path)), name)
    log = log_steps(EpisodeLog(recording), steps)
    recording.flush()
    recording.disconnect()
    return log
