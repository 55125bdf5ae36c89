"""Recording one scripted demonstration as an :class:`~heisd_ros.data.episode.EpisodeRecord`."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from heisd_ros.data.episode import EpisodeRecord, EpisodeRecorder
from heisd_ros.sim.env import PiperSimEnv
from heisd_ros.sim.expert import ScriptedExpert
from heisd_ros.sim.runner import reset_policy, resolve_policy, split_output, step_limit


@dataclasses.dataclass(frozen=True)
class ExecutionNoise:
    """Noise added to the expert's command before the arm executes it (DART).

    Behaviour cloning from clean demonstrations never shows the policy a state off the
    expert's path, so its own small errors compound (covariate shift). DART (Laskey et al.,
    "DART: Noise Injection for Robust Imitation Learning", CoRL 2017) executes the expert's
    action plus noise while recording the expert's clean action as the label; our expert
    plans against the commanded pose, so its next action steers back to its path and the
    demonstrations gain the corrections a policy needs. The gripper is never perturbed.

    Per-step noise of a few mm keeps the arm within a few mm of the path, but a policy's own
    errors are larger: an uncertain first step or a misjudged transit leaves the arm
    centimetres off, a state such demonstrations never show. Rare *kicks* (a large
    translation offset on a random step, like a bump or an overshoot) add those states and
    the expert's recovery from them, without making every label a large correction.

    Attributes:
        translation_m: standard deviation per axis of the translation noise, m.
        rotation_rad: standard deviation per axis of the roll/pitch/yaw noise, rad.
        kick_probability: chance per step of a kick.
        kick_m: standard deviation per axis of a kick's translation, m.
    """

    translation_m: float = 0.0
    rotation_rad: float = 0.0
    kick_probability: float = 0.0
    kick_m: float = 0.0

    def __post_init__(self) -> None:
        for name in ("translation_m", "rotation_rad", "kick_m"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}: expected a finite value >= 0, got {value!r}")
        if not 0.0 <= self.kick_probability <= 1.0:
            raise ValueError(f"kick_probability: expected [0, 1], got {self.kick_probability!r}")
        if (self.kick_probability > 0) != (self.kick_m > 0):
            raise ValueError(f"kick_probability and kick_m: set both or neither, got "
                             f"{self.kick_probability!r} and {self.kick_m!r}")

    @property
    def active(self) -> bool:
        """True when any noise is added."""
        return self.translation_m > 0 or self.rotation_rad > 0 or self.kick_m > 0

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        """(7,) offset to add to an action: translation, rotation, gripper (always 0)."""
        scale = np.repeat([self.translation_m, self.rotation_rad], 3)
        offset = np.append(rng.normal(0.0, scale), 0.0)
        # Drawn only when kicks are on, so kick-free noise keeps its random stream.
        if self.kick_m > 0 and rng.random() < self.kick_probability:
            offset[:3] += rng.normal(0.0, self.kick_m, 3)
        return offset


def record_expert_episode(env: PiperSimEnv, expert: ScriptedExpert, seed: int,
                          max_steps: int | None = None,
                          noise: ExecutionNoise | None = None) -> EpisodeRecord:
    """Reset ``env`` and ``expert`` with ``seed`` and run until success or ``max_steps``.

    The episode ends on the first step after which the task predicate holds (LIBERO's
    convention), so demonstrations contain no idle tail. ``record.success`` tells whether
    that happened; callers drop failures. With ``noise`` the arm executes the expert's
    action plus noise (seeded by ``seed``) and the record keeps the expert's action as the
    label (see :class:`ExecutionNoise`).
    """
    limit = step_limit(env.task, max_steps)
    observation = env.reset(seed)
    expert.reset(seed)
    return _record_expert(env, expert, observation, seed, limit, noise,
                          {"source": "scripted_expert"})


@dataclasses.dataclass(frozen=True)
class TakeoverResult:
    """A :func:`record_takeover_episode` attempt.

    ``record`` is None when there is nothing to record: the policy ended the episode itself
    (``policy_succeeded``: it succeeded before the take-over step), or the episode ended
    (success or step limit) within the expert's unrecorded steps.
    """

    record: EpisodeRecord | None
    takeover_step: int
    policy_steps: int
    policy_succeeded: bool = False


def record_takeover_episode(env: PiperSimEnv, expert: ScriptedExpert, policy, seed: int,
                            takeover_step: int, max_steps: int | None = None,
                            noise: ExecutionNoise | None = None,
                            unrecorded_steps: int = 0) -> TakeoverResult:
    """A policy drives for ``takeover_step`` steps, then the expert finishes the episode.

    Only the expert's part is recorded, starting at the state the policy left: states a
    policy really reaches (heading for the wrong object, off the demonstrations' paths),
    labelled with the expert's way to the goal from there. This is the data-aggregation
    step of DAgger (Ross et al., "A Reduction of Imitation Learning and Structured Prediction
    to No-Regret Online Learning", AISTATS 2011), with the expert taking over rather than
    labelling every policy step: our expert plans segments, so its labels are consistent
    only along its own continuation. ``policy`` has ``act(observation)`` (an action, or
    (action, stats)) and optionally ``reset()``. The step limit counts both parts.

    ``unrecorded_steps``: the expert's first steps after the take-over are executed but not
    recorded. Its plan starts each segment from rest (a transit at 41% of peak speed), so
    where the policy was mid-transit the first labels say "slow down" at states whose
    demonstration labels say "keep going"; leaving them out keeps the two consistent.
    """
    if takeover_step < 0:
        raise ValueError(f"takeover_step: expected >= 0, got {takeover_step}")
    if unrecorded_steps < 0:
        raise ValueError(f"unrecorded_steps: expected >= 0, got {unrecorded_steps}")
    limit = step_limit(env.task, max_steps)
    observation = env.reset(seed)
    reset_policy(policy)
    act = resolve_policy(policy)
    steps = 0
    for steps in range(1, min(takeover_step, limit) + 1):
        action, _ = split_output(act(observation))
        result = env.step(action)
        observation = result.observation
        if result.success:
            return TakeoverResult(None, takeover_step, steps, policy_succeeded=True)
    expert.take_over(seed)
    record = _record_expert(env, expert, observation, seed, limit - steps, noise,
                            {"source": "expert_takeover", "takeover_step": int(takeover_step),
                             "policy_steps": int(steps),
                             "unrecorded_steps": int(unrecorded_steps)},
                            skip=unrecorded_steps)
    return TakeoverResult(record, takeover_step, steps)


def record_policy_episode(env: PiperSimEnv, policy, seed: int,
                          max_steps: int | None = None) -> EpisodeRecord:
    """Reset ``env`` with ``seed`` and record ``policy``'s own episode, labelled with its actions.

    The recorded action at each step is the one the policy executed there, so a retrieval DB
    built from such episodes drafts what the target itself did at a similar state, where a
    DB of the expert's demonstrations drafts what the expert did. ``record.success`` tells
    whether the task predicate held before ``max_steps`` (the task's own limit by default);
    callers drop failures, so the DB holds only the target's successful paths. ``policy`` has
    ``act(observation)`` (an action, or (action, stats)) and optionally ``reset()``.
    """
    limit = step_limit(env.task, max_steps)
    observation = env.reset(seed)
    reset_policy(policy)
    act = resolve_policy(policy)

    def label(obs) -> np.ndarray:
        return np.asarray(split_output(act(obs))[0], dtype=np.float64)

    return _record(env, label, observation, seed, limit, None, {"source": "policy_rollout"})


def _record_expert(env: PiperSimEnv, expert: ScriptedExpert, observation, seed: int,
                   limit: int, noise: ExecutionNoise | None, metadata: dict,
                   skip: int = 0) -> EpisodeRecord | None:
    """The expert's steps from ``observation`` on, until success or ``limit`` steps.

    The first ``skip`` steps are executed but not recorded; None when no step was recorded.
    """
    noise = noise if noise is not None and noise.active else None
    return _record(env, expert.act, observation, seed, limit, noise,
                   {**metadata, "expert_config": dataclasses.asdict(expert.config),
                    "execution_noise": dataclasses.asdict(noise or ExecutionNoise())},
                   skip)


def _record(env: PiperSimEnv, label, observation, seed: int, limit: int,
            noise: ExecutionNoise | None, metadata: dict,
            skip: int = 0) -> EpisodeRecord | None:
    """Record ``label(observation)``'s actions from ``observation`` on, until success or ``limit``.

    With ``noise`` (active) the arm executes the label plus noise seeded by ``seed``; the
    record keeps the label. The first ``skip`` steps are executed but not recorded; None when
    no step was recorded.
    """
    task = env.task
    noise_rng = np.random.default_rng([seed, 0xDA27])
    recorder = EpisodeRecorder(task.suite, task.name, task.instruction, seed,
                               env.config.control_rate_hz,
                               metadata={**metadata,
                                         "sim_config": dataclasses.asdict(env.config)})
    state = env.robot_state()
    success = False
    for step in range(limit):
        action = label(observation)
        executed = action + noise.sample(noise_rng) if noise is not None else action
        result = env.step(executed)
        if step >= skip:
            recorder.add(image_third_person=observation.image_primary,
                         image_wrist=observation.image_wrist,
                         joint_positions_rad=state.joint_positions_rad,
                         gripper_width_m=state.gripper_width_m,
                         ee_position_m=state.ee_position_m, ee_rpy_rad=state.ee_rpy_rad,
                         ee_quat_xyzw=observation.extras["ee_quat_xyzw"], action=action,
                         stamp_s=observation.stamp_s, success=result.success)
        observation, state = result.observation, result.state
        if result.success:
            success = True
            break
    return recorder.finish(success) if len(recorder) else None
