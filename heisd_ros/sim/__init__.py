"""Simulation: the MuJoCo PIPER tabletop, task suites and scripted experts.

Entry points (import from the modules; ``mujoco`` is loaded only when they are imported):

- :mod:`.env`: ``PiperSimEnv(task, SimConfig)`` with ``reset(seed)``, ``step(action)``,
  ``move_to(position_m, rpy_rad, gripper_width_m)``, ``observe()``, ``robot_state()``.
- :mod:`.suites`: ``list_suites()``, ``list_tasks(suite)``, ``get_task(suite, task)``.
- :mod:`.conveyor`: ``ConveyorSpec``, a belt that moves things with world time (``piper_dynamic``).
- :mod:`.expert`: ``ScriptedExpert(env)``; :mod:`.demos`: ``record_expert_episode``.
- :mod:`.runner`: ``run_episodes(policy, suite, task, n, seed, max_steps)``.
- :mod:`.collection`: what ``heisd-collect`` runs.
"""
