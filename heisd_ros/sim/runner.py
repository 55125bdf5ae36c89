"""Closed-loop evaluation: run any policy on a task for N seeded episodes.

A policy is anything that maps an :class:`Observation` to a 7-DoF action: a callable, or an
object with ``act(observation)``. It may return the action alone or ``(action, stats)`` with
a dict of per-step statistics (decoder counters, latencies), which are collected verbatim.
If it has a ``reset()`` method, that is called at the start of every episode, right after the
simulator was reset (so a privileged policy such as the scripted expert sees the new scene).
"""

from __future__ import annotations

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


def run_episodes(policy: Any, suite: str, task: str, n: int, seed: int,
                 max_steps: int | None = None, *, config: SimConfig | None = None,
                 observer: StepObserver | None = None,
                 env: PiperSimEnv | None = None) -> RunResults:
    """Run ``policy`` for ``n`` episodes with seeds ``seed, seed + 1, ...``.

    An episode ends at the first step after which the task succeeds, or after ``max_steps``
    (default: the task's own limit). The simulator is built once and closed at the end, unless
    the caller passes its own ``env`` for this task (then ``config`` is ignored and the caller
    closes it).
    """
    if n < 1:
        raise ValueError(f"n: expected >= 1 episodes, got {n}")
    spec = get_task(suite, task)
    limit = step_limit(spec, max_steps)
    act = resolve_policy(policy)
    if env is not None and env.task is not spec:
        raise ValueError(f"env: built for task {env.task.suite}/{env.task.name}, "
                         f"not {suite}/{task}")
    owned = env is None
    sim = PiperSimEnv(spec, config) if owned else env
    try:
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
        for text in outcome.limits:
            kind = text.split(":", 1)[0]
            result.limits[kind] = result.limits.get(kind, 0) + 1
        if stats is not None:
            result.stats.append(stats)
        if observer is not None:
            observer(index, step, observation, action, outcome)
        observation = outcome.observation
        if outcome.success:
            break
    return result


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
