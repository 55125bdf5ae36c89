"""Closed-loop evaluation: run any policy on a task for N seeded episodes.

A policy is anything that maps an :class:`Observation` to a 7-DoF action: a callable, or an
object with ``act(observation)``. It may return the action alone or ``(action, stats)`` with
a dict of per-step statistics (decoder counters, latencies), which are collected verbatim.
If it has a ``reset()`` method, that is called at the start of every episode, right after the
simulator was reset (so a privileged policy such as the scripted expert sees the new scene).

Two timings. Lockstep (the default): the world waits for the policy; every action runs exactly
one control period. Real time (``realtime=RealTime(...)``): the world moves while the policy
decides, so its latency costs world time (see :class:`RealTime`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from heisd_ros.data.observation import Observation, check_action
from heisd_ros.sim.config import SimConfig
from heisd_ros.sim.env import PiperSimEnv, StepResult
from heisd_ros.sim.suites import get_task
from heisd_ros.sim.tasks import TaskSpec

#: Called after every step: (episode index, step index, observation, action, step result).
StepObserver = Callable[[int, int, Observation, np.ndarray, StepResult], None]


@dataclass
class EpisodeResult:
    """Outcome of one closed-loop episode."""

    suite: str
    task: str
    seed: int
    instruction: str
    success: bool
    steps: int
    stats: list[dict[str, Any]] = field(default_factory=list)
    #: How many steps each kind of limit clamped the command ("workspace", ...; see
    #: ``StepResult.limits``): a policy that keeps pushing against a limit shows here.
    limits: dict[str, int] = field(default_factory=dict)
    #: Real time only (None in lockstep): world time the episode took (s) and the commands
    #: applied (``steps`` is the same count there).
    world_time_s: float | None = None
    commands: int | None = None


@dataclass
class RunResults:
    """All episodes of one ``run_episodes`` call."""

    episodes: list[EpisodeResult]

    @property
    def successes(self) -> int:
        """Number of successful episodes."""
        return sum(e.success for e in self.episodes)

    @property
    def success_rate(self) -> float:
        """Fraction of successful episodes (NaN when there are none)."""
        return self.successes / len(self.episodes) if self.episodes else float("nan")


#: Longest stretch of world time (s) run without checking for success in real time.
SUCCESS_CHECK_S = 0.02
#: Slack (in frames or physics steps) for float error when a time is rounded up to the grid.
_GRID_SLACK = 1e-6


@dataclass(frozen=True)
class RealTime:
    """Real-time episodes: the world moves while the policy decides.

    The episode gets the world time of a lockstep episode of the same step limit
    (``limit * control period``). A decision starts at the first camera frame (multiples of
    ``1 / camera_rate_hz`` of world time since the episode start) at or after both the world's
    current time and the previous decision's start plus one control period: the policy never
    runs faster than the control rate its actions (one control period's delta each) are meant
    for. The world is advanced to that frame and observed; the policy's whole ``act`` call is
    timed with ``clock``; its action is commanded at ``start + latency * time_scale`` of world
    time, the arm tracking the previous target meanwhile. Success is checked every
    :data:`SUCCESS_CHECK_S` of world time, so an episode succeeds between commands, and it
    stops exactly when its time is spent. A command that would land at or after that end is
    not applied and not counted.

    Attributes:
        time_scale: world seconds per wall second of the policy's decision (1: real time; 2:
            the world runs twice as fast, as for a policy twice as slow; 0.5 slows the world).
        camera_rate_hz: frame rate of the cameras, which decisions start on.
        pace: the wall clock follows the world too: a decision does not start before its
            frame's time on the wall clock (the episode's world time / ``time_scale`` after
            its start), as on a robot, so work a policy leaves running in the background (a
            check behind) has the wall time the world gives it. False: decisions follow each
            other at once (a shorter evaluation; the same figures for a policy without
            background work).
        clock: wall clock in seconds (tests inject a fake one the policy advances).
        sleep: waits a number of wall seconds (tests inject one that advances their clock).
        profile: a ``heisd_ros.latency.LatencyProfile``: a decision's latency is not the
            wall time of ``act`` but its step record's ``counters`` priced by the profile
            (times ``time_scale``), plus the time it waits for a check behind that still
            holds the device (``heisd_ros.latency.DeviceTimeline``). Deterministic: the same
            seeds give the same episodes on any machine at any load; no pacing is needed
            (``pace`` must stay False). The policy must return stats with ``counters``.
    """

    time_scale: float = 1.0
    camera_rate_hz: float = 30.0
    pace: bool = False
    profile: Any = None
    clock: Callable[[], float] = field(default=time.perf_counter, compare=False, repr=False)
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("time_scale", "camera_rate_hz"):
            value = getattr(self, name)
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or value <= 0):
                raise ValueError(f"{name}: expected a finite number > 0, got {value!r}")
        if not callable(self.clock):
            raise ValueError(f"clock: expected a callable returning seconds, got "
                             f"{type(self.clock).__name__}")
        if self.profile is not None:
            from heisd_ros.latency.profile import LatencyProfile

            if not isinstance(self.profile, LatencyProfile):
                raise ValueError(f"profile: expected a LatencyProfile or None, got "
                                 f"{type(self.profile).__name__}")
            if self.pace:
                raise ValueError("pace: a run at a latency profile is priced, not paced; "
                                 "leave pace False")


def run_episodes(policy: Any, suite: str, task: str, n: int, seed: int,
                 max_steps: int | None = None, *, config: SimConfig | None = None,
                 observer: StepObserver | None = None,
                 env: PiperSimEnv | None = None,
                 realtime: RealTime | None = None) -> RunResults:
    """Run ``policy`` for ``n`` episodes with seeds ``seed, seed + 1, ...``.

    An episode ends at the first step after which the task succeeds, or after ``max_steps``
    (default: the task's own limit). The simulator is built once and closed at the end, unless
    the caller passes its own ``env`` for this task (then ``config`` is ignored and the caller
    closes it).

    ``realtime``: None runs lockstep; a :class:`RealTime` lets the world move while the policy
    decides, for ``max_steps`` control periods of world time. Each step's stats then also hold
    ``rt_latency_ms`` (the wall time of ``act``), ``rt_world_latency_ms`` (that in world time:
    the command's age when applied), ``rt_period_ms`` (world time from this decision's start
    to the next's; None for the last) and ``rt_late`` (the world latency exceeded a control
    period), merged into the policy's own stats dict (the same object) or in a new one. The
    observer is called at every command with a ``StepResult`` holding the observation the
    decision was made on, the robot state and success at the command, and the command's limits.
    """
    if n < 1:
        raise ValueError(f"n: expected >= 1 episodes, got {n}")
    spec = get_task(suite, task)
    limit = step_limit(spec, max_steps)
    act = resolve_policy(policy)
    if realtime is not None and not isinstance(realtime, RealTime):
        raise ValueError(f"realtime: expected a RealTime or None, got "
                         f"{type(realtime).__name__}")
    if env is not None and env.task is not spec:
        raise ValueError(f"env: built for task {env.task.suite}/{env.task.name}, "
                         f"not {suite}/{task}")
    owned = env is None
    sim = PiperSimEnv(spec, config) if owned else env
    try:
        if realtime is not None:
            return RunResults([_realtime_episode(sim, act, policy, seed + i, i, limit, observer,
                                                 realtime) for i in range(n)])
        return RunResults([_episode(sim, act, policy, seed + i, i, limit, observer)
                           for i in range(n)])
    finally:
        if owned:
            sim.close()


def _episode(env: PiperSimEnv, act: Callable[[Observation], Any], policy: Any, seed: int,
             index: int, limit: int, observer: StepObserver | None) -> EpisodeResult:
    observation = env.reset(seed)
    reset_policy(policy)
    task = env.task
    result = EpisodeResult(task.suite, task.name, seed, task.instruction, False, 0)
    for step in range(limit):
        action, stats = split_output(act(observation))
        outcome = env.step(action)
        result.steps, result.success = step + 1, outcome.success
        _count_limits(result, outcome.limits)
        if stats is not None:
            result.stats.append(stats)
        if observer is not None:
            observer(index, step, observation, action, outcome)
        observation = outcome.observation
        if outcome.success:
            break
    return result


def _realtime_episode(env: PiperSimEnv, act: Callable[[Observation], Any], policy: Any,
                      seed: int, index: int, limit: int, observer: StepObserver | None,
                      realtime: RealTime) -> EpisodeResult:
    """One real-time episode (see :class:`RealTime`); world time counted in physics steps."""
    observation = env.reset(seed)
    reset_policy(policy)
    task, cfg = env.task, env.config
    dt, period = cfg.physics_timestep_s, 1.0 / cfg.control_rate_hz
    budget = limit * cfg.substeps          # physics steps: the world time of a lockstep episode
    chunk = max(1, int(SUCCESS_CHECK_S / dt + _GRID_SLACK))
    result = EpisodeResult(task.suite, task.name, seed, task.instruction, False, 0,
                           world_time_s=0.0, commands=0)
    done = 0                               # physics steps run since the episode start

    def advance_to(step: int) -> bool:
        """Run the world up to physics step ``step`` (at most the budget); True on success."""
        nonlocal done
        step = min(step, budget)
        while done < step:
            n = min(chunk, step - done)
            env.advance(n)
            done += n
            if env.success():
                return True
        return False

    def step_at(t_s: float) -> int:
        """The first physics step at or after world time ``t_s``."""
        return math.ceil(t_s / dt - _GRID_SLACK)

    previous_start: float | None = None
    previous_record: dict | None = None
    timeline = None
    if realtime.profile is not None:
        from heisd_ros.latency.pricing import DeviceTimeline

        timeline = DeviceTimeline(realtime.profile, realtime.time_scale)
    wall_start = realtime.clock()
    while True:
        earliest = done * dt if previous_start is None else max(done * dt,
                                                                previous_start + period)
        start = math.ceil(earliest * realtime.camera_rate_hz - _GRID_SLACK) \
            / realtime.camera_rate_hz
        if step_at(start) >= budget:       # no time left for a decision
            result.success = advance_to(budget)
            break
        if advance_to(step_at(start)):
            result.success = True
            break
        if previous_record is not None:
            previous_record["rt_period_ms"] = (start - previous_start) * 1e3
        if done > 0:                       # at the start, the reset's observation is current
            observation = env.observe()
        if realtime.pace:                  # not before the frame's time on the wall clock
            wait_s = wall_start + start / realtime.time_scale - realtime.clock()
            if wait_s > 0:
                realtime.sleep(wait_s)
        began = realtime.clock()
        output = act(observation)
        latency_s = realtime.clock() - began
        action, stats = split_output(output)
        world_latency_s = latency_s * realtime.time_scale
        priced = None
        if timeline is not None:
            if stats is None or "counters" not in stats:
                raise ValueError("profile: the policy's stats carry no 'counters' to price "
                                 "(a decoder policy's step record has them)")
            priced = timeline.decide(start, stats["counters"])
            world_latency_s = priced.latency_ms / 1e3
        apply_step = step_at(start + world_latency_s)
        if apply_step >= budget:           # the command would land when the time is up
            result.success = advance_to(budget)
            break
        if advance_to(apply_step):         # done before the command landed
            result.success = True
            break
        limits = env.command_delta(action)
        record = stats if stats is not None else {}
        record.update(rt_latency_ms=latency_s * 1e3, rt_world_latency_ms=world_latency_s * 1e3,
                      rt_period_ms=None, rt_late=bool(world_latency_s > period))
        if priced is not None:
            record.update(rt_device_wait_ms=priced.wait_ms,
                          rt_priced_ms={k: v * realtime.time_scale
                                        for k, v in priced.priced.parts.items()},
                          rt_check_ms=priced.priced.check_ms * realtime.time_scale)
        result.stats.append(record)
        result.commands += 1
        result.steps = result.commands
        _count_limits(result, limits)
        if observer is not None:
            observer(index, result.commands - 1, observation, action,
                     StepResult(observation, env.robot_state(), env.success(), limits))
        previous_start, previous_record = start, record
    result.world_time_s = done * dt
    return result


def _count_limits(result: EpisodeResult, limits: tuple[str, ...]) -> None:
    """Count each kind of limit ("workspace", ...) that changed a command."""
    for text in limits:
        kind = text.split(":", 1)[0]
        result.limits[kind] = result.limits.get(kind, 0) + 1


def step_limit(task: TaskSpec, max_steps: int | None) -> int:
    """Steps an episode of ``task`` may take: ``max_steps``, else the task's own limit."""
    limit = task.max_steps if max_steps is None else int(max_steps)
    if limit < 1:
        raise ValueError(f"max_steps: expected >= 1, got {max_steps}")
    return limit


def reset_policy(policy: Any) -> None:
    """Call the policy's ``reset()`` if it has one (after the simulator's reset)."""
    if callable(getattr(policy, "reset", None)):
        policy.reset()


def resolve_policy(policy: Any) -> Callable[[Observation], Any]:
    """The policy's ``act``, or the policy itself if it is a callable."""
    if callable(getattr(policy, "act", None)):
        return policy.act
    if callable(policy):
        return policy
    raise ValueError(f"policy: expected a callable or an object with act(observation), got "
                     f"{type(policy).__name__}")


def split_output(output: Any) -> tuple[np.ndarray, dict | None]:
    """(checked action, stats or None) of one policy output."""
    if isinstance(output, tuple):
        if len(output) != 2 or not (output[1] is None or isinstance(output[1], dict)):
            raise ValueError("policy: a tuple output must be (action, stats dict or None)")
        return check_action(output[0]), output[1]
    return check_action(output), None
