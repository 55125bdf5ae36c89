"""The sim node's parameters: its config dataclass and the checks of suite and task names.

No node here: :class:`heisd_ros.nodes.sim_node.SimNode` fills :class:`SimNodeConfig` from its
parameters and asks :func:`parameter_problem` before it takes a new ``suite``, ``task`` or
``seed`` at run time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from heisd_ros.nodes.robot_msgs import GRIPPER_JOINT_NAME, PIPER_JOINT_NAMES
from heisd_ros.sim.modes import SIM_MODES
from heisd_ros.sim.suites import list_suites, list_tasks

#: The sim node's /diagnostics status with its command counters.
SIM_DIAGNOSTICS = "sim_node: commands"

@dataclass
class SimNodeConfig:
    """Settings of the sim node (the scene has ``sim.*``, safety and gripper their own).

    Attributes:
        mode: "realtime": the world runs with the clock, the cameras stream and the arm
            tracks the latest accepted command, whether or not one comes; "lockstep": each
            command runs one control period of physics and nothing moves between commands
            (reproducible evaluation).
        time_scale: real time: world seconds per wall second (0.5: the world runs at half
            speed, as if the policy ran on a machine twice as fast); rates below are world
            rates.
        third_person_rate_hz, wrist_rate_hz: real time: camera frame rates (world), Hz.
        max_lag_s: real time: when physics and rendering fall this far behind the clock
            (world s), the world is slowed instead of catching up in a burst (counted, warned).
        max_steps: steps per episode; 0 = the task's own limit. In real time the episode
            has ``max_steps`` control periods of world time (what a lockstep episode gets)
            and ends with reason "time_limit".
        state_period_s: publish /joint_states and /ee_pose this often, s (real time: world
            s, from the physics thread; lockstep: wall s, the state republished).
        frame_republish_s: lockstep: without a command for this long, send the current
            camera frames again with a fresh stamp, s; 0 = never.
        max_tracking_error_m: controller FAULT distance between commanded and measured
            flange, m; 0 = off.
        max_command_age_s: real time: refuse a command whose stamp (the frames it was decided
            on) is older than this when the arm would take it, as the PIPER driver's
            ``controller.max_command_age_s`` does (same default), world s (wall s times
            ``time_scale``); 0 = off. Lockstep never checks: the world waits for the policy.
        frame_id: frame of /ee_pose and of the camera images' header.
        joint_names: names of the six arm joints in /joint_states.
        gripper_joint_name: name of the gripper opening (m) in /joint_states.
        auto_reset: start the next episode by itself when one ends (success or max_steps),
            with the next seed, so a launched demo keeps running; false = wait for ~/reset.
        auto_reset_delay_s: pause between the end of an episode and the automatic reset, s
            (the final state stays visible and the policy sees the episode end first).
        auto_reset_next_task: the automatic reset moves on to the suite's next task (in
            suite order, wrapping around) instead of repeating the task.
    """

    mode: str = "realtime"
    time_scale: float = 1.0
    third_person_rate_hz: float = 30.0
    wrist_rate_hz: float = 30.0
    max_lag_s: float = 0.25
    max_steps: int = 0
    state_period_s: float = 0.1
    frame_republish_s: float = 2.0
    max_tracking_error_m: float = 0.10
    max_command_age_s: float = 0.5
    frame_id: str = "base_link"
    joint_names: tuple[str, ...] = PIPER_JOINT_NAMES
    gripper_joint_name: str = GRIPPER_JOINT_NAME
    auto_reset: bool = True
    auto_reset_delay_s: float = 2.0
    auto_reset_next_task: bool = False

    def __post_init__(self) -> None:
        if self.mode not in SIM_MODES:
            raise ValueError(f"mode: expected one of {', '.join(SIM_MODES)}, got {self.mode!r}")
        for name in ("time_scale", "third_person_rate_hz", "wrist_rate_hz", "max_lag_s"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise ValueError(f"{name}: expected a finite value > 0, got {getattr(self, name)}")
        if self.max_steps < 0:
            raise ValueError(f"max_steps: expected >= 0, got {self.max_steps}")
        if not (math.isfinite(self.state_period_s) and self.state_period_s > 0):
            raise ValueError(f"state_period_s: expected > 0 s, got {self.state_period_s}")
        for name in ("frame_republish_s", "max_tracking_error_m", "auto_reset_delay_s",
                     "max_command_age_s"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(f"{name}: expected >= 0, got {getattr(self, name)}")
        if len(self.joint_names) != 6:
            raise ValueError(f"joint_names: expected 6 names, got {list(self.joint_names)!r}")
        if not self.frame_id:
            raise ValueError("frame_id: expected a frame name like 'base_link', got ''")


def parameter_problem(name: str, value, suite: str) -> str:
    """Why ``value`` cannot be parameter ``name`` ("" if it can), with the valid names.

    A task of another suite is fine here (the user may be switching both); ``~/reset``
    checks the pair.
    """
    if name == "seed":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return f"seed: expected an int >= 0, got {value!r}"
        return ""
    if not isinstance(value, str):
        return f"{name}: expected a string, got {value!r}"
    if name == "suite":
        return "" if value in list_suites() else (
            f"suite: unknown suite {value!r}; valid suites are {list_suites()}")
    if any(value in list_tasks(s) for s in list_suites()):
        return ""
    if suite in list_suites():
        valid = f"valid tasks of suite {suite!r} are {list_tasks(suite)}"
    else:
        valid = f"valid tasks are {dict((s, list_tasks(s)) for s in list_suites())}"
    return f"task: unknown task {value!r}; {valid}"


def next_task(suite: str, task: str) -> str:
    """The task after ``task`` in ``suite``, wrapping around (its first if ``task`` is not in it).

    Raises:
        ValueError: an unknown suite (the message lists the valid ones).
    """
    tasks = list_tasks(suite)
    return tasks[(tasks.index(task) + 1) % len(tasks)] if task in tasks else tasks[0]
