"""The policy node's step loop, without ROS: newest input in, one command out, or a hold.

Steps run in a thread of their own, woken (:meth:`StepLoop.wake`) by new frames and episode
requests, so no executor thread is parked for a whole decode. One wake-up decodes steps back
to back while new paired frames come, one at a time: the next observation is handed to the
decoder as soon as a command is out, and the step's visualisation is published while that
next observation decodes, so the decoder does not wait for it.

A step, in order:

1. start a requested episode (:mod:`heisd_ros.nodes.policy_episode`): reset the input gate
   and the decoder's episode state;
2. keep ``min_period_s`` since the last step;
3. take the newest robot state and ask the input gate for a snapshot (a refusal is a hold);
4. with an instruction, hand the observation to the decoder;
5. when the decoder is done, hold the command if its frames got too old
   (:mod:`heisd_ros.nodes.policy_staleness`), else publish it and advance the episode.

A decode that fails with ``ValueError`` or ``RuntimeError`` is a hold ("decode failed"). A
lost decode worker (:class:`~heisd_ros.nodes.decode_worker.WorkerError`) goes to the owner's
``worker_lost``, which drops the decoder. Any other error ends the thread: it is kept in
:attr:`StepLoop.failure` and ``failed`` is called, so the owner can raise it where it would
stop the process.

The decoder is a decode worker (``heisd_ros.nodes.decode_worker``) or, in this thread, a
``NodeDecoder`` (``heisd_ros.nodes.policy_decoders``), which has the worker's
``submit``/``result``.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from heisd_ros.data.episode import make_proprio
from heisd_ros.data.observation import Observation
from heisd_ros.nodes.decode_worker import WorkerError
from heisd_ros.nodes.policy_episode import EpisodeTracker
from heisd_ros.nodes.policy_inputs import InputGate, Snapshot
from heisd_ros.nodes.policy_staleness import HoldPolicy, stale_command

if TYPE_CHECKING:
    from heisd_ros.nodes.policy_config import PolicyNodeConfig
    from heisd_ros.nodes.policy_decoders import DecodedStep
    from heisd_ros.nodes.policy_diagnostics import StepLatency

#: Longest wait at shutdown for a step under way, s (then the owner stops the worker under it).
STEP_JOIN_TIMEOUT_S = 5.0
#: publish(step, step_index, snapshot): send the command now; return what publishes the
#: step's visualisation, which the loop calls once the next observation decodes.
Publish = Callable[["DecodedStep", int, Snapshot], Callable[[], None]]


class StepLoop:
    """Runs the policy's steps in a thread of its own (module docstring).

    ``decoder`` (None: act on nothing) has ``submit(observation)``, ``result()`` and
    ``begin_episode(task)``: a decode worker, or a ``NodeDecoder`` decoding in this thread.
    Reads ``min_period_s`` and ``max_command_age_s`` from ``config`` at each step.

    Attributes:
        decoder: the decoder in use, or None.
        commands_sent: commands published (the next command's step index).
        failure: the error that ended the thread, or None.
    """

    def __init__(self, config: PolicyNodeConfig, gate: InputGate, episodes: EpisodeTracker,
                 holds: HoldPolicy, latency: StepLatency, *, clock: Callable[[], float],
                 publish: Publish, take_robot_state: Callable[[], None],
                 worker_lost: Callable[[WorkerError], None],
                 episode_started: Callable[[str], None], failed: Callable[[], None],
                 gate_lock: threading.Lock | None = None,
                 perf_counter: Callable[[], float] = time.perf_counter) -> None:
        """Wire the loop; :meth:`start` starts its thread.

        Args:
            config: the node's settings.
            gate: the input gate, shared with the input callbacks under ``gate_lock``.
            episodes: the instruction, the task and the episode.
            holds: counts and reports the holds.
            latency: the step-latency statistics (``policy_diagnostics.StepLatency``).
            clock: the node's clock, s (frame stamps are on it).
            publish: sends a step's command (:data:`Publish`).
            take_robot_state: hands the newest robot state to the gate.
            worker_lost: the decode worker died; the owner drops the decoder.
            episode_started: called with the reason once an episode has started.
            failed: called in the step thread once :attr:`failure` is set.
            gate_lock: the lock the input callbacks hold to feed ``gate``.
            perf_counter: times the decode, s.
        """
        self.config = config
        self.gate = gate
        self.episodes = episodes
        self.holds = holds
        self.latency = latency
        self.decoder = None
        self.commands_sent = 0
        self.failure: BaseException | None = None
        self._clock = clock
        self._publish = publish
        self._take_robot_state = take_robot_state
        self._worker_lost = worker_lost
        self._episode_started = episode_started
        self._failed = failed
        self._gate_lock = gate_lock if gate_lock is not None else threading.Lock()
        self._perf_counter = perf_counter
        self._last_step_t = -math.inf
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="policy_step", daemon=True)

    def start(self) -> None:
        """Start the step thread."""
        self._thread.start()

    def wake(self) -> None:
        """New input: run the steps it allows (in the step thread)."""
        self._wake.set()

    def stop(self, timeout_s: float = STEP_JOIN_TIMEOUT_S) -> None:
        """Stop the thread; a step under way finishes, within ``timeout_s``."""
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=timeout_s)

    def raise_failure(self) -> None:
        """Raise the error that ended the thread, if one did (the owner calls this)."""
        if self.failure is not None:
            raise self.failure

    def _run(self) -> None:
        """The step thread: a step run each time new input wakes it, until the loop stops."""
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stopping:
                return
            try:
                self.run_steps()
            except Exception as exc:  # noqa: BLE001 - handed to the owner, which raises it
                self.failure = exc
                self._failed()
                return

    def run_steps(self) -> None:
        """Decode steps back to back while new paired frames come, one at a time."""
        viz = None
        while self.decoder is not None:
            pending = self._begin_step()
            if viz is not None:
                viz()
                viz = None
            if pending is None:
                return
            try:
                step = self.decoder.result()
            except WorkerError as exc:
                self._worker_lost(exc)
                return
            except (ValueError, RuntimeError) as exc:
                self.holds.refuse("decode failed", f"decode failed: {exc}")
                continue
            viz = self._end_step(pending, step)
        if viz is not None:
            viz()

    def _start_requested_episode(self) -> None:
        request = self.episodes.start_requested()
        if request is None:
            return
        with self._gate_lock:
            self.gate.reset(request.since_s)
        if self.decoder is not None:
            try:
                self.decoder.begin_episode(self.episodes.state.task)
            except WorkerError as exc:
                self._worker_lost(exc)
        self._episode_started(request.why)

    def _begin_step(self) -> tuple | None:
        """Take the newest inputs and hand their observation to the decoder; None: no step."""
        if self.decoder is None:
            return None
        self._start_requested_episode()
        if self.decoder is None:  # the worker was lost as the episode began: act on nothing
            return None
        now = self._clock()
        if now - self._last_step_t < self.config.min_period_s:
            return None
        self._take_robot_state()
        with self._gate_lock:
            result = self.gate.take(now)
        if result.problem:
            self.holds.refuse(result.kind, result.problem)
            return None
        snap = result.snapshot
        if snap is None:
            return None
        instruction = self.episodes.instruction
        if not instruction.strip():
            self.holds.refuse("no instruction", "no instruction: set the `instruction` "
                                                "parameter or call ~/set_instruction")
            return None
        robot = snap.robot
        proprio = make_proprio(robot.ee_position_m, robot.ee_rpy_rad, robot.gripper_width_m)
        observation = Observation(
            image_primary=snap.third_person, image_wrist=snap.wrist,
            instruction=instruction, proprio=proprio, stamp_s=snap.stamp_s,
            episode=self.episodes.state)
        t0 = self._perf_counter()
        try:
            self.decoder.submit(observation)
        except WorkerError as exc:
            self._worker_lost(exc)
            return None
        return snap, now, t0

    def _end_step(self, pending: tuple, step: DecodedStep) -> Callable[[], None] | None:
        """Send the step's command unless its frames got too old; the viz to publish, or None."""
        snap, now, t0 = pending
        decode_ms = (self._perf_counter() - t0) * 1e3
        self._last_step_t = now
        self.latency.step_started(snap.stamp_s, now)
        problem = stale_command(self._clock() - snap.stamp_s, self.config.max_command_age_s,
                                decode_ms)
        self.latency.decoded(decode_ms, held_stale=bool(problem))
        self.holds.check_speed(self.latency)
        if problem:
            self.holds.refuse("stale command", problem)
            return None
        viz = self._publish(step, self.commands_sent, snap)
        # What the robot did not get (a held command) leaves the episode as it was.
        self.episodes.executed(step.action)
        self.latency.published(snap.stamp_s, self._clock(), decode_ms)
        self.commands_sent += 1
        self.holds.sent()
        return viz
