"""Demonstration collection: scripted episodes per task, written as npz and/or rosbag2.

Each requested task gets ``episodes`` attempts with seeds ``seed, seed + 1, ...``; attempts in
which the scripted expert fails are dropped (never written) and counted in the summary.
With a take-over policy (``collect(..., policy=...)`` and ``CollectConfig.takeover_steps``)
each attempt is a policy's episode that the expert finishes (DAgger-style data, see
:func:`~heisd_ros.sim.demos.record_takeover_episode`); attempts the policy finished itself
before the take-over are dropped and counted too. With ``CollectConfig.policy_rollouts``
each attempt is the policy's own episode, labelled with its own actions
(:func:`~heisd_ros.sim.demos.record_policy_episode`); attempts it fails are dropped.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from heisd_ros.data.npz_episodes import episode_path, save_episode
from heisd_ros.data.rosbag_io import make_typestore, write_episode_bag
from heisd_ros.sim.config import SimConfig
from heisd_ros.sim.demos import (
    ExecutionNoise,
    record_expert_episode,
    record_policy_episode,
    record_takeover_episode,
)
from heisd_ros.sim.env import PiperSimEnv
from heisd_ros.sim.expert import ExpertConfig, ScriptedExpert
from heisd_ros.sim.suites import get_task, list_tasks

FORMATS = ("npz", "mcap", "sqlite3", "both")
#: The folder's summary of every collection run written into it.
SUMMARY_FILE = "summary.json"

#: Called after every attempt with (suite, task, seed, kept).
ProgressCallback = Callable[[str, str, int, bool], None]


@dataclass(frozen=True)
class CollectConfig:
    """What to collect and where.

    Attributes:
        suites: suite names; every task of each, unless ``tasks`` narrows it down.
        tasks: task names to keep (empty = all tasks of the suites); each must exist in at
            least one of the suites.
        episodes: attempts per task.
        seed: seed of the first attempt.
        out_dir: output root.
        fmt: "npz", "mcap", "sqlite3" (rosbag2 storage) or "both" (npz + mcap).
        overwrite: replace existing episode files instead of refusing.
        max_steps: per-episode step limit (None = each task's own limit).
        noise: DART execution noise (none by default); the recorded action is always the
            expert's own (see :class:`~heisd_ros.sim.demos.ExecutionNoise`).
        takeover_steps: (first, last) step at which the expert takes over from the policy
            passed to :func:`collect`, drawn uniformly per attempt (seeded by its seed);
            None = the expert's own episodes.
        takeover_unrecorded_steps: the expert's first steps after a take-over that are
            executed but not recorded (see :func:`~heisd_ros.sim.demos.record_takeover_episode`).
        policy_rollouts: each attempt is the policy's own episode with its own actions as
            labels (the policy passed to :func:`collect`; no expert, no execution noise).
    """

    suites: tuple[str, ...]
    tasks: tuple[str, ...] = ()
    episodes: int = 10
    seed: int = 0
    out_dir: str = "demos"
    fmt: str = "npz"
    overwrite: bool = False
    max_steps: int | None = None
    noise: ExecutionNoise = ExecutionNoise()
    takeover_steps: tuple[int, int] | None = None
    takeover_unrecorded_steps: int = 0
    policy_rollouts: bool = False

    def __post_init__(self) -> None:
        if self.policy_rollouts and self.takeover_steps is not None:
            raise ValueError("policy_rollouts and takeover_steps: choose one (the policy's own "
                             "episodes, or the expert taking over from it)")
        if self.policy_rollouts and self.noise.active:
            raise ValueError("policy_rollouts: execution noise is for expert labels; a "
                             "policy's rollout records the action it executed")
        if self.takeover_steps is not None:
            first, last = self.takeover_steps
            if not 0 <= first <= last:
                raise ValueError(f"takeover_steps: expected 0 <= first <= last, got "
                                 f"{self.takeover_steps}")
        if self.takeover_unrecorded_steps < 0:
            raise ValueError(f"takeover_unrecorded_steps: expected >= 0, got "
                             f"{self.takeover_unrecorded_steps}")
        if not self.suites:
            raise ValueError("suites: expected at least one suite name")
        if self.episodes < 1:
            raise ValueError(f"episodes: expected >= 1, got {self.episodes}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps: expected >= 1 or None, got {self.max_steps}")
        if self.fmt not in FORMATS:
            raise ValueError(f"fmt: expected one of {FORMATS}, got {self.fmt!r}")
        known = {t for suite in self.suites for t in list_tasks(suite)}  # validates suites
        unknown = sorted(set(self.tasks) - known)
        if unknown:
            raise ValueError(f"tasks: {unknown} are not in suites {list(self.suites)}; valid "
                             f"tasks are {sorted(known)}")

    def selected(self) -> list[tuple[str, str]]:
        """(suite, task) pairs to collect, in order."""
        return [(suite, task) for suite in self.suites for task in list_tasks(suite)
                if not self.tasks or task in self.tasks]

    @property
    def total_attempts(self) -> int:
        """Episodes that will be attempted in all."""
        return len(self.selected()) * self.episodes


def takeover_step(config: CollectConfig, seed: int) -> int:
    """The step at which the expert takes over in attempt ``seed`` (reproducible)."""
    first, last = config.takeover_steps
    return int(np.random.default_rng([seed, 0x7A0E]).integers(first, last + 1))


def collect(config: CollectConfig, sim_config: SimConfig | None = None,
            expert_config: ExpertConfig | None = None,
            progress: ProgressCallback | None = None, policy=None,
            policy_description: str = "") -> dict:
    """Record demonstrations; return the JSON-serialisable summary (also the summary file's).

    ``policy`` (with ``config.takeover_steps``): drives each attempt until the expert takes
    over; (with ``config.policy_rollouts``) drives each attempt alone. A ``task`` attribute,
    if it has one, is set to the task name (hybrid decoders' DB collection).

    Raises :class:`CollectionStopped`, which carries the summary of the attempts that finished,
    when interrupted (KeyboardInterrupt) part-way.
    """
    wants_policy = config.takeover_steps is not None or config.policy_rollouts
    if (policy is None) == wants_policy:
        raise ValueError("policy and takeover_steps or policy_rollouts: pass a policy with one "
                         "of them (take-over collection, the policy's own episodes) or neither")
    out = Path(config.out_dir)
    _check_free(out, config)
    typestore = make_typestore() if config.fmt != "npz" else None
    per_task: dict[str, dict] = {}
    with_policy = policy is not None
    suite = task = None  # the task under way, for a stop part-way
    counts = _TaskCounts()
    try:
        for suite, task in config.selected():
            counts = _TaskCounts()
            if policy is not None and hasattr(policy, "task"):
                policy.task = task
            with PiperSimEnv(get_task(suite, task), sim_config) as env:
                expert = ScriptedExpert(env, expert_config)
                for seed in range(config.seed, config.seed + config.episodes):
                    if policy is None:
                        record = record_expert_episode(env, expert, seed, config.max_steps,
                                                       config.noise)
                    elif config.policy_rollouts:
                        record = record_policy_episode(env, policy, seed, config.max_steps)
                    else:
                        attempt = record_takeover_episode(
                            env, expert, policy, seed, takeover_step(config, seed),
                            config.max_steps, config.noise, config.takeover_unrecorded_steps)
                        record = attempt.record
                        if attempt.policy_succeeded:
                            counts.policy_done.append(seed)
                    kept_this = record is not None and record.success
                    if kept_this:
                        _write(record, out, config, typestore)
                        counts.kept.append(seed)
                        counts.steps.append(record.num_steps)
                    else:
                        counts.dropped.append(seed)
                    if progress is not None:
                        progress(suite, task, seed, kept_this)
            per_task[f"{suite}/{task}"] = counts.as_dict(with_policy)
            suite = None
    except KeyboardInterrupt:
        if suite is not None and (counts.kept or counts.dropped):
            per_task[f"{suite}/{task}"] = counts.as_dict(with_policy)
        summary = _run_summary(config, per_task, sim_config, expert_config, policy,
                               policy_description)
        summary["stopped_at"] = None if suite is None else {
            "suite": suite, "task": task, "seed": config.seed + len(counts.kept)
            + len(counts.dropped)}
        raise CollectionStopped(summary) from None
    return _run_summary(config, per_task, sim_config, expert_config, policy,
                        policy_description)


class CollectionStopped(KeyboardInterrupt):
    """A collection interrupted part-way (Ctrl-C; SIGTERM in ``heisd-collect``).

    ``summary`` is the run's summary over the attempts that finished (each task's
    ``attempted`` is what ran) with ``stopped_at``: the suite and task under way and the first
    seed of it that did not finish (None if it stopped between tasks). Every kept episode of
    a finished attempt is on disk; the cut-off attempt wrote nothing.
    """

    def __init__(self, summary: dict) -> None:
        super().__init__("collection stopped part-way")
        self.summary = summary


@dataclass
class _TaskCounts:
    """One task's attempts so far."""

    kept: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    policy_done: list[int] = field(default_factory=list)

    def as_dict(self, with_policy: bool) -> dict:
        counts = {"attempted": len(self.kept) + len(self.dropped), "kept": len(self.kept),
                  "dropped": len(self.dropped), "dropped_seeds": list(self.dropped),
                  "mean_steps": round(sum(self.steps) / len(self.steps), 1)
                  if self.steps else None}
        if with_policy:
            counts["policy_succeeded_seeds"] = list(self.policy_done)
        return counts


def _run_summary(config: CollectConfig, per_task: dict, sim_config: SimConfig | None,
                 expert_config: ExpertConfig | None, policy, policy_description: str) -> dict:
    """The JSON-serialisable summary of one collection run."""
    takeover = None if config.takeover_steps is None else {
        "steps": list(config.takeover_steps), "policy": policy_description or repr(policy),
        "unrecorded_steps": config.takeover_unrecorded_steps}
    return {
        "format": config.fmt, "out_dir": str(Path(config.out_dir)), "seed": config.seed,
        "episodes_per_task": config.episodes, "execution_noise": asdict(config.noise),
        "takeover": takeover,
        "policy_rollouts": (policy_description or repr(policy)) if config.policy_rollouts
        else None,
        "total_kept": sum(v["kept"] for v in per_task.values()),
        "total_dropped": sum(v["dropped"] for v in per_task.values()),
        "tasks": per_task, "sim_config": asdict(sim_config or SimConfig()),
        "expert": asdict(expert_config or ExpertConfig()),
    }


def dataset_summary(previous: dict | None, run: dict) -> dict:
    """The summary file of a folder after ``run`` (a :func:`collect` result) is added to it.

    Several runs may write into one folder (other suites, other seeds, two processes side by
    side). The file lists every run under ``runs`` and merges their ``tasks`` and totals, so no
    run's counts are lost. A run with the same first seed and tasks as an earlier one (an
    ``overwrite`` re-run) replaces it. A summary written before ``runs`` existed counts as one run.
    """
    runs = [] if previous is None else list(previous.get("runs", [previous]))
    runs = [r for r in runs
            if not (r.get("seed") == run["seed"] and set(r.get("tasks", {})) == set(run["tasks"]))]
    runs.append(run)
    tasks: dict[str, dict] = {}
    for entry in runs:
        for name, counts in entry.get("tasks", {}).items():
            merged = tasks.setdefault(name, {"attempted": 0, "kept": 0, "dropped": 0,
                                             "dropped_seeds": [], "total_steps": 0.0})
            for key in ("attempted", "kept", "dropped"):
                merged[key] += counts[key]
            merged["dropped_seeds"] = sorted(merged["dropped_seeds"] + counts["dropped_seeds"])
            merged["total_steps"] += (counts["mean_steps"] or 0.0) * counts["kept"]
    for merged in tasks.values():
        total_steps = merged.pop("total_steps")
        merged["mean_steps"] = round(total_steps / merged["kept"], 1) if merged["kept"] else None
    return {"out_dir": run["out_dir"],
            "total_kept": sum(v["kept"] for v in tasks.values()),
            "total_dropped": sum(v["dropped"] for v in tasks.values()),
            "tasks": tasks, "runs": runs}


def write_summary(out_dir: str | Path, run: dict) -> Path:
    """Add ``run`` to ``<out_dir>/summary.json`` (:func:`dataset_summary`); returns its path.

    Holds an exclusive lock on the folder while it reads and rewrites the file, so two
    collections finishing at once both land (POSIX ``flock``).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / SUMMARY_FILE
    try:
        import fcntl
    except ImportError:  # not POSIX: no folder lock, the last writer wins
        fcntl = None
    handle = os.open(out, os.O_RDONLY) if fcntl is not None else None
    try:
        if handle is not None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        previous = json.loads(path.read_text()) if path.is_file() else None
        scratch = path.with_name(f".{SUMMARY_FILE}.{os.getpid()}")
        scratch.write_text(json.dumps(dataset_summary(previous, run), indent=2) + "\n")
        os.replace(scratch, path)
    finally:
        if handle is not None:
            os.close(handle)  # releases the lock
    return path


def bag_path(root: str | Path, suite: str, task: str, seed: int) -> Path:
    """The rosbag2 directory of (suite, task, seed), next to its npz file."""
    return episode_path(root, suite, task, seed).with_suffix("").with_name(
        f"episode_{int(seed):06d}_bag")


def _targets(out: Path, config: CollectConfig, suite: str, task: str,
             seed: int) -> list[tuple[str, Path]]:
    """(storage kind, path) of every file/directory one episode is written to."""
    targets: list[tuple[str, Path]] = []
    if config.fmt in ("npz", "both"):
        targets.append(("npz", episode_path(out, suite, task, seed)))
    if config.fmt != "npz":
        storage = "sqlite3" if config.fmt == "sqlite3" else "mcap"
        targets.append((storage, bag_path(out, suite, task, seed)))
    return targets


def _check_free(out: Path, config: CollectConfig) -> None:
    """Fail before any simulation when an output exists and overwriting was not asked for."""
    if config.overwrite:
        return
    for suite, task in config.selected():
        for seed in range(config.seed, config.seed + config.episodes):
            for _, path in _targets(out, config, suite, task, seed):
                if path.exists():
                    raise ValueError(f"out_dir: {path} already exists; pass overwrite=True "
                                     f"(--overwrite) or choose another output directory")


def _write(record, out: Path, config: CollectConfig, typestore) -> None:
    for kind, path in _targets(out, config, record.suite, record.task, record.seed):
        if path.is_dir():
            shutil.rmtree(path)  # only reachable with overwrite=True, see _check_free
        if kind == "npz":
            save_episode(record, path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_episode_bag(record, path, storage=kind, typestore=typestore)


def summary_lines(summary: dict) -> Sequence[str]:
    """Human-readable summary, one line per task plus a total."""
    lines = [f"{name}: kept {v['kept']}/{v['attempted']}"
             + (f" (dropped seeds {v['dropped_seeds']})" if v["dropped"] else "")
             + (f", the policy finished {len(v['policy_succeeded_seeds'])} before the "
                f"take-over" if v.get("policy_succeeded_seeds") else "")
             + (f", mean {v['mean_steps']} steps" if v["mean_steps"] else "")
             for name, v in summary["tasks"].items()]
    what = ("attempts (expert failed, or nothing to record after the take-over)"
            if summary.get("takeover") else "failed policy episodes"
            if summary.get("policy_rollouts") else "failed expert episodes")
    lines.append(f"total: kept {summary['total_kept']}, dropped {summary['total_dropped']} "
                 f"{what}; written to {summary['out_dir']} ({summary['format']})")
    return lines
