"""The policy node's episodes, without ROS: when a new one starts, and what the robot got so far.

A new episode starts on

- a new key (suite, task, episode, seed) of the episode status, or the same key from its
  start again: its step went back (a restarted sim begins at episode 0 again), or it runs
  again after it was done;
- a call of ``set_instruction`` (instruction and task);
- a new ``task`` (the task names the retrieval DB collection; the same one again is no new
  episode);
- an EE jump of more than ``jump_m`` between two robot states whose numbers are all finite
  (the arm was reset or moved by hand).

A start is only requested here; the step loop starts it before its next step, in its own
thread (:meth:`EpisodeTracker.start_requested`), so a step never sees half of an episode's
reset. Requests that come before that step coalesce: the last one names the episode.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from heisd_ros.data.observation import EpisodeState
from heisd_ros.nodes.policy_inputs import RobotInput


@dataclass(frozen=True)
class EpisodeRequest:
    """A new episode to start before the next step.

    Attributes:
        why: what started it (for the log line).
        task: the episode's task; None or "": the current task.
        since_s: the episode's start stamp, s; frames stamped from then on count for it
            (:meth:`~heisd_ros.nodes.policy_inputs.InputGate.reset`). None: only frames that
            arrive after the reset.
    """

    why: str
    task: str | None = None
    since_s: float | None = None


@dataclass(frozen=True)
class EpisodeProgress:
    """One episode status (``/heisd/episode_status``) in plain values.

    Attributes:
        suite, task, episode, seed: the episode's key.
        step: the step it is at.
        done: it has ended.
        start_s: its start stamp, s (0 or less: not stamped).
    """

    suite: str
    task: str
    episode: int
    seed: int
    step: int
    done: bool
    start_s: float = 0.0


class EpisodeTracker:
    """The instruction, the task and the episode the robot got (module docstring).

    Attributes:
        instruction, task: what the policy acts on (parameters, service, episode status).
        state: the episode as the robot got it; advanced only by a command sent
            (:meth:`executed`).
        pending: the episode to start before the next step, or None.
        progress: (step, done) of the last episode status, or None before the first.
        started: episodes started so far.
    """

    def __init__(self, instruction: str = "", task: str = "", jump_m: float = 0.0,
                 on_request: Callable[[], None] = lambda: None) -> None:
        """Start with the given instruction and task.

        Args:
            instruction: the ``instruction`` parameter at start.
            task: the ``task`` parameter at start.
            jump_m: an EE jump longer than this starts an episode, m (0: off).
            on_request: called after each request (the node wakes its step loop with it).
        """
        self.instruction = instruction
        self.task = task
        self.jump_m = jump_m
        self.state = EpisodeState(task or None)
        self.pending: EpisodeRequest | None = None
        self.progress: tuple[int, bool] | None = None
        self.started = 0
        self._on_request = on_request
        self._key: tuple | None = None
        self._ended = False
        self._last_ee_m: np.ndarray | None = None

    def request(self, why: str, task: str | None = None, since_s: float | None = None) -> None:
        """Start a new episode before the next step (:class:`EpisodeRequest`)."""
        self.pending = EpisodeRequest(why, task, since_s)
        self._on_request()

    def set_instruction(self, instruction: str, task: str) -> None:
        """A new instruction and task (the node's service): always a new episode."""
        self.instruction, self.task = instruction, task
        self._key = ("set_instruction", instruction, task)
        self.request("new instruction", task)

    def set_task(self, task: str) -> None:
        """The ``task`` parameter: a new episode when it changes."""
        if task != self.task:
            self.task = task
            self.request(f"task parameter set to {task!r}", task)

    def follow(self, instruction: str, task: str) -> None:
        """Take the episode status's instruction and (when it names one) task."""
        self.instruction, self.task = instruction, task or self.task

    def status(self, progress: EpisodeProgress) -> None:
        """An episode status: a new key, or a restart of the current one, starts an episode."""
        key = (progress.suite, progress.task, progress.episode, progress.seed)
        last = self.progress
        restarted = key == self._key and last is not None and (
            progress.step < last[0] or (last[1] and not progress.done))
        self.progress = (int(progress.step), bool(progress.done))
        if key != self._key or restarted:
            self._key = key
            self._ended = False
            since_s = progress.start_s if progress.start_s > 0 else None
            self.request(f"episode {progress.episode} of {progress.task or progress.suite} "
                         f"(seed {progress.seed}) {'restarted' if restarted else 'started'}",
                         progress.task, since_s=since_s)

    def end(self) -> bool:
        """The episode ended: True the first time, so the decoder hears of it once."""
        if self._ended:
            return False
        self._ended = True
        return True

    def robot_state(self, robot: RobotInput | None, problem: str = "") -> None:
        """A new robot state: an EE jump of more than ``jump_m`` starts an episode.

        A state the input gate refuses (``problem``, non-finite numbers) says nothing of where
        the arm is: it is neither compared nor kept.
        """
        if robot is None or problem or robot.problem():
            return
        if self._last_ee_m is not None and self.jump_m > 0:
            moved_m = float(np.linalg.norm(robot.ee_position_m - self._last_ee_m))
            if moved_m > self.jump_m:
                self.request(f"the EE jumped {moved_m:.3f} m between two robot states "
                             f"(episode_jump_m {self.jump_m} m)", since_s=robot.stamp_s)
        self._last_ee_m = np.array(robot.ee_position_m, dtype=np.float64)

    def start_requested(self) -> EpisodeRequest | None:
        """Start the requested episode (fresh state, not ended); its request, or None."""
        request, self.pending = self.pending, None
        if request is None:
            return None
        self._ended = False
        self.state = EpisodeState(request.task or self.task or None)
        self.started += 1
        return request

    def executed(self, action: np.ndarray) -> None:
        """A command of ``action`` was sent: the episode moves on a step."""
        self.state = self.state.executed(action)
