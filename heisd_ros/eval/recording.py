"""Recording closed-loop simulator runs of any policy to rosbag2 (``heisd-record``).

The robot topics are those of :mod:`heisd_ros.data.rosbag_io` (same messages as
``write_episode_bag``); decoder policies add ``/heisd/hybrid_step`` (``heisd_ros/msg/HybridStep``
registered from ``msg/HybridStep.msg``) with the counters and latencies of every step, and
their EE commands carry the source that produced them (AR, drafter, retrieval, skip). The
cameras are raw Images (rgb8, bgr8, mono8) or, like image_transport's compressed transport,
CompressedImages (jpeg, png) on ``<camera topic>/compressed``.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
from rosbags.rosbag2 import Writer
from rosbags.typesys import get_types_from_msg
from rosbags.typesys.store import Typestore

from heisd_ros.data import rosbag_io
from heisd_ros.data.episode import EpisodeRecord, EpisodeRecorder
from heisd_ros.decoding.interface import ROUTER_MODE_NAMES, ROUTER_RETRIEVAL

TOPIC_HYBRID_STEP = "/heisd/hybrid_step"
HYBRID_STEP_TYPE = "heisd_ros/msg/HybridStep"
# A step record's router mode by name -> HybridStep.router_mode.
_ROUTER = {**{name: mode for mode, name in ROUTER_MODE_NAMES.items()}, "skip": ROUTER_RETRIEVAL}
# EECommand.SOURCE_*: AR, drafter, retrieval, retrieval without verification.
_SOURCE = {"": 0, "drafter": 1, "retrieval": 2}
_SOURCE_SKIP = 3


def make_recording_typestore(msg_dir: str | Path | None = None) -> Typestore:
    """The rosbag_io typestore plus ``heisd_ros/msg/HybridStep``."""
    ts = rosbag_io.make_typestore(msg_dir)
    path = Path(msg_dir) if msg_dir is not None else rosbag_io.default_msg_dir()
    ts.register(get_types_from_msg((path / "HybridStep.msg").read_text(), HYBRID_STEP_TYPE))
    return ts


class EpisodeTape:
    """Runner observer that records every step of every episode (images, state, action).

    ``steps[episode]`` collects the policy's per-step stats dicts when the policy hands them
    back (see :class:`heisd_ros.eval.methods.DecoderPolicy`); pass them to :meth:`finish`.
    """

    def __init__(self, suite: str, task: str, instruction: str, seed: int,
                 control_rate_hz: float):
        self._args = (suite, task, instruction, control_rate_hz)
        self._seed = seed
        self.recorders: dict[int, EpisodeRecorder] = {}

    def __call__(self, episode: int, step: int, obs, action, outcome) -> None:
        """Runner callback (see ``heisd_ros.sim.runner.StepObserver``)."""
        suite, task, instruction, rate = self._args
        rec = self.recorders.setdefault(episode, EpisodeRecorder(
            suite, task, instruction, self._seed + episode, rate, {"source": "heisd-record"}))
        proprio = np.asarray(obs.proprio, dtype=np.float64)
        rec.add(image_third_person=obs.image_primary, image_wrist=obs.image_wrist,
                joint_positions_rad=obs.extras["joint_positions_rad"],
                gripper_width_m=float(proprio[6]), ee_position_m=proprio[:3],
                ee_rpy_rad=proprio[3:6], ee_quat_xyzw=obs.extras["ee_quat_xyzw"],
                action=action, stamp_s=obs.stamp_s, success=outcome.success)

    def finish(self, episode: int, success: bool) -> EpisodeRecord:
        """The record of ``episode``."""
        return self.recorders[episode].finish(success)


def hybrid_step_fields(step: dict) -> dict:
    """The HybridStep fields (no header, index or task) of a step record.

    A hybrid decoder's own record (``step["hybrid"]``) is used as is when present (None
    becomes NaN); a plain decode's counters fill the rest, router fields NaN.
    """
    if step.get("hybrid"):
        return {k: (float("nan") if v is None else v) for k, v in step["hybrid"].items()}
    ms = step["stage_ms"]
    nan = float("nan")
    return dict(
        router_mode=_ROUTER.get(step["router_mode"], 2), fused_metric=nan, curvature_term=nan,
        displacement_term=nan, curvature_radius_m=nan, displacement_m=nan, router_threshold=nan,
        draft_source=_SOURCE.get(step["draft_source"].split("+")[0], 0),
        verify_skipped=step["verify_skipped"], unverified_run=int(step["verify_skipped"]),
        skip_rule="similarity" if step["verify_skipped"] else "", skip_similarity=nan,
        skip_threshold=nan, checked_behind=False, behind_result=0, behind_bin_difference=-1,
        behind_wait_ms=0.0, behind_check_ms=nan, accepted_tokens=step["tokens_from_draft"],
        accepted_length_per_round=list(step["accepted_lengths"]),
        first_error_position=step.get("first_error_position", -1),
        target_forwards=step["target_forwards"], drafter_forwards=step["drafter_forwards"],
        retrieval_calls=step["retrieval_calls"], action_bins=list(step["bins"]),
        action=list(step["action"]),
        **{f"{k}_ms": float(ms.get(k, 0.0)) for k in ("vision", "retrieval", "prefill", "draft",
                                                      "verify", "overhead", "total")},
        status="")


def hybrid_step_msg(ts: Typestore, step: dict, index: int, task: str, header) -> object:
    """A HybridStep message from a step record (see :func:`hybrid_step_fields`)."""
    fields = hybrid_step_fields(step)
    for key, dtype in (("accepted_length_per_round", np.uint8), ("action_bins", np.uint8),
                       ("action", np.float64)):
        fields[key] = np.asarray(fields[key], dtype=dtype)
    return ts.types[HYBRID_STEP_TYPE](header=header, step_index=index, task=task, **fields)


def write_run_bag(record: EpisodeRecord, steps: list[dict] | None, path: str | Path,
                  storage: str = "mcap", typestore: Typestore | None = None,
                  camera_format: str = "rgb8") -> Path:
    """Like ``write_episode_bag``, plus ``/heisd/hybrid_step`` when ``steps`` are given.

    Each EE command's ``source`` is the step's (AR 0, drafter 1, retrieval 2, skip 3), or
    SCRIPTED (4) without step records. ``camera_format``: one of
    :data:`~heisd_ros.data.rosbag_io.CAMERA_FORMATS`.
    """
    if storage not in rosbag_io.STORAGES:
        raise ValueError(f"storage: expected one of {sorted(rosbag_io.STORAGES)}, got "
                         f"{storage!r}")
    if steps is not None and len(steps) != record.num_steps:
        raise ValueError(f"steps: expected {record.num_steps} step records, got {len(steps)}")
    ts = typestore or make_recording_typestore()
    types = rosbag_io.topic_types(camera_format)
    if steps is not None:
        types[TOPIC_HYBRID_STEP] = HYBRID_STEP_TYPE
    with Writer(Path(path), version=9, storage_plugin=rosbag_io.STORAGES[storage]) as writer:
        for key in ("suite", "task", "instruction", "seed"):
            writer.set_custom_data(f"heisd.{key}", str(getattr(record, key)))
        writer.set_custom_data("heisd.success", str(bool(record.success)).lower())
        conns = {t: writer.add_connection(t, m, typestore=ts) for t, m in types.items()}
        for t in range(record.num_steps):
            stamp_ns = int(round(float(record.stamp_s[t]) * 1e9))
            step = steps[t] if steps is not None else None
            source = rosbag_io.SOURCE_SCRIPTED if step is None else (
                _SOURCE_SKIP if step["verify_skipped"]
                else _SOURCE.get(step["draft_source"].split("+")[0], 0))
            # The robot topics exactly as write_episode_bag writes them.
            msgs = list(rosbag_io._step_messages(ts, record, t, stamp_ns, "base_link", source,
                                                 True, camera_format))
            if step is not None:
                header = msgs[-1][1].header
                msgs.append((TOPIC_HYBRID_STEP, hybrid_step_msg(ts, step, t, record.task, header)))
            for topic, msg in msgs:
                writer.write(conns[topic], stamp_ns, ts.serialize_cdr(msg, types[topic]))
    return Path(path)


def record_runs(policy, suite: str, task: str, episodes: int, seed: int, out_dir: str | Path,
                *, storage: str = "mcap", max_steps: int | None = None, sim_config=None,
                env=None, progress: Callable[[int, bool], None] | None = None,
                camera_format: str = "rgb8", overwrite: bool = False) -> list[dict]:
    """Run ``policy`` for ``episodes`` seeded episodes and write one bag per episode.

    Bags go to ``<out_dir>/<suite>/<task>/episode_<seed>_bag`` (must not exist, unless
    ``overwrite``: then those bag directories, and nothing else, are replaced); the cameras
    are written in ``camera_format`` (see :func:`write_run_bag`). Returns one summary dict per
    episode (seed, success, steps, bag path).
    """
    from heisd_ros.sim.collection import bag_path
    from heisd_ros.sim.config import SimConfig
    from heisd_ros.sim.runner import run_episodes
    from heisd_ros.sim.suites import get_task

    rosbag_io.topic_types(camera_format)  # a bad format fails before any simulation
    spec = get_task(suite, task)
    config = sim_config or SimConfig()
    paths = [bag_path(out_dir, suite, task, seed + i) for i in range(episodes)]
    existing = [p for p in paths if p.exists()]
    if existing and not overwrite:
        raise ValueError(f"out_dir: {[str(p) for p in existing]} already exist; remove them, "
                         f"pass --overwrite or choose another --out")
    for path in existing:
        shutil.rmtree(path)
    ts = make_recording_typestore()
    out = []
    for i, path in enumerate(paths):
        tape = EpisodeTape(suite, task, spec.instruction, seed + i, config.control_rate_hz)
        result = run_episodes(policy, suite, task, 1, seed + i, max_steps, config=config,
                              observer=tape, env=env).episodes[0]
        if callable(getattr(policy, "finish_checks", None)):
            policy.finish_checks()   # heisd_behind: the last action's check
        steps = result.stats if result.stats and "stage_ms" in result.stats[0] else None
        path.parent.mkdir(parents=True, exist_ok=True)
        write_run_bag(tape.finish(0, result.success), steps, path, storage, ts, camera_format)
        entry = {"seed": seed + i, "success": result.success, "steps": result.steps,
                 "bag": str(path)}
        checks = [s["behind"] for s in steps or () if s.get("behind")]
        if checks:   # each HybridStep says only its predecessor's verdict
            entry.update(checked_behind=len(checks),
                         rejected_behind=sum(not c["confirmed"] for c in checks))
        out.append(entry)
        if progress is not None:
            progress(i + 1, result.success)
    return out
