"""Recording one scripted demonstration as an :class:`~heisd_ros.data.episode.EpisodeRecord`."""

from __future__ import annotations

import dataclasses

from heisd_ros.data.episode import EpisodeRecord, EpisodeRecorder
from heisd_ros.sim.env import PiperSimEnv
from heisd_ros.sim.expert import ScriptedExpert


def record_expert_episode(env: PiperSimEnv, expert: ScriptedExpert, seed: int,
                          max_steps: int | None = None) -> EpisodeRecord:
    """Reset ``env`` and ``expert`` with ``seed`` and run until success or ``max_steps``.

    The episode ends on the first step after which the task predicate holds (LIBERO's
    convention), so demonstrations contain no idle tail. ``record.success`` tells whether
    that happened; callers drop failures.
    """
    task = env.task
    limit = task.max_steps if max_steps is None else int(max_steps)
    if limit < 1:
        raise ValueError(f"max_steps: expected >= 1, got {max_steps}")
    observation = env.reset(seed)
    expert.reset(seed)
    recorder = EpisodeRecorder(task.suite, task.name, task.instruction, seed,
                               env.config.control_rate_hz,
                               metadata={"source": "scripted_expert",
                                         "sim_config": dataclasses.asdict(env.config),
                                         "expert_config": dataclasses.asdict(expert.config)})
    state = env.robot_state()
    success = False
    for _ in range(limit):
        action = expert.act(observation)
        result = env.step(action)
        recorder.add(image_third_person=observation.image_primary,
                     image_wrist=observation.image_wrist,
                     joint_positions_rad=state.joint_positions_rad,
                     gripper_width_m=state.gripper_width_m, ee_position_m=state.ee_position_m,
                     ee_rpy_rad=state.ee_rpy_rad,
                     ee_quat_xyzw=observation.extras["ee_quat_xyzw"], action=action,
                     stamp_s=observation.stamp_s, success=result.success)
        observation, state = result.observation, result.state
        if result.success:
            success = True
            break
    return recorder.finish(success)
