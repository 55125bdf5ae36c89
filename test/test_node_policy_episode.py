"""The policy node's episode tracking (pure Python: no rclpy, no DDS)."""

from __future__ import annotations

import numpy as np

from heisd_ros.nodes.policy_episode import EpisodeProgress, EpisodeRequest, EpisodeTracker
from heisd_ros.nodes.policy_inputs import RobotInput


def tracker(**kwargs) -> tuple[EpisodeTracker, list[int]]:
    """A tracker and the list its on_request callback appends to."""
    woken: list[int] = []
    kwargs.setdefault("jump_m", 0.1)
    return EpisodeTracker(on_request=lambda: woken.append(1), **kwargs), woken


def status(step, done=False, key=("piper_goal", "t", 0, 0), start_s=0.0):
    suite, task, episode, seed = key
    return EpisodeProgress(suite, task, episode, seed, step, done, start_s)


def robot(x_m, stamp_s=10.0, joints=0.1):
    return RobotInput(stamp_s, np.full(6, joints), 0.07, np.array([x_m, 0.0, 0.3]), np.zeros(3))


def test_a_new_status_key_starts_an_episode_and_the_same_one_going_on_does_not():
    episodes, woken = tracker()
    episodes.status(status(0, start_s=12.5))
    assert episodes.pending == EpisodeRequest("episode 0 of t (seed 0) started", "t", 12.5)
    assert episodes.progress == (0, False) and woken == [1]
    assert episodes.start_requested() is not None
    episodes.status(status(4))
    assert episodes.pending is None and episodes.progress == (4, False) and woken == [1]
    episodes.status(status(4, key=("piper_goal", "t", 1, 0)))  # the next episode
    assert episodes.pending.why == "episode 1 of t (seed 0) started"


def test_the_same_key_from_its_start_again_is_a_restart():
    episodes, _ = tracker()
    episodes.status(status(0))
    episodes.start_requested()
    episodes.status(status(5))
    assert episodes.pending is None
    episodes.status(status(0))      # its step went back: a restarted sim
    assert episodes.pending.why == "episode 0 of t (seed 0) restarted"
    episodes.start_requested()
    episodes.status(status(3, done=True))
    assert episodes.pending is None
    episodes.status(status(3))      # running again after it was done
    assert episodes.pending.why.endswith("restarted")


def test_an_unstamped_status_keeps_only_frames_after_the_reset_and_suite_names_it():
    episodes, _ = tracker()
    episodes.status(status(0, key=("piper_goal", "", 2, 7), start_s=0.0))
    assert episodes.pending == EpisodeRequest("episode 2 of piper_goal (seed 7) started", "",
                                              None)


def test_set_instruction_always_starts_an_episode_and_set_task_only_a_new_one():
    episodes, woken = tracker(instruction="a", task="t0")
    episodes.set_instruction("stack them", "t1")
    assert (episodes.instruction, episodes.task) == ("stack them", "t1")
    assert episodes.pending == EpisodeRequest("new instruction", "t1")
    episodes.start_requested()
    episodes.set_instruction("stack them", "t1")
    assert episodes.pending == EpisodeRequest("new instruction", "t1") and len(woken) == 2
    episodes.start_requested()
    episodes.set_task("t1")
    assert episodes.pending is None
    episodes.set_task("other")
    assert episodes.task == "other"
    assert episodes.pending == EpisodeRequest("task parameter set to 'other'", "other")


def test_set_instruction_makes_the_next_status_key_new():
    episodes, _ = tracker()
    episodes.status(status(0))
    episodes.set_instruction("pick", "")
    episodes.start_requested()
    episodes.status(status(1))  # the status key again, after another instruction: new
    assert episodes.pending is not None and episodes.pending.why.endswith("started")


def test_follow_takes_the_status_instruction_and_keeps_the_task_when_it_names_none():
    episodes, woken = tracker(task="t0")
    episodes.follow("put it there", "")
    assert (episodes.instruction, episodes.task) == ("put it there", "t0")
    episodes.follow("put it here", "t2")
    assert (episodes.instruction, episodes.task) == ("put it here", "t2")
    assert episodes.pending is None and woken == []


def test_an_episode_ends_once_until_the_next_one_starts():
    episodes, _ = tracker()
    episodes.status(status(0))
    assert episodes.end() and not episodes.end()
    episodes.status(status(1, done=True))   # its own end again: still once
    assert not episodes.end()
    episodes.status(status(0, key=("piper_goal", "t", 1, 0)))
    assert episodes.end()
    episodes.start_requested()              # a start forgets the end too
    assert episodes.end()


def test_an_ee_jump_starts_an_episode_from_its_stamp_and_a_small_move_does_not():
    episodes, woken = tracker(jump_m=0.1)
    episodes.robot_state(robot(0.3))
    episodes.robot_state(robot(0.35))
    assert episodes.pending is None and woken == []
    episodes.robot_state(robot(0.6, stamp_s=11.0))
    assert episodes.pending == EpisodeRequest(
        "the EE jumped 0.250 m between two robot states (episode_jump_m 0.1 m)", None, 11.0)
    episodes.start_requested()
    episodes.robot_state(robot(0.61))       # compared with the state after the jump
    assert episodes.pending is None


def test_a_refused_robot_state_is_neither_compared_nor_kept():
    episodes, _ = tracker(jump_m=0.1)
    episodes.robot_state(robot(0.3))
    episodes.robot_state(robot(0.9, joints=float("nan")))  # NaN in the state
    episodes.robot_state(robot(0.9), problem="malformed joint state")
    episodes.robot_state(None, problem="malformed joint state")
    assert episodes.pending is None
    episodes.robot_state(robot(0.32))       # still next to the last good state
    assert episodes.pending is None


def test_a_zero_jump_limit_turns_jump_detection_off():
    episodes, _ = tracker(jump_m=0.0)
    episodes.robot_state(robot(0.3))
    episodes.robot_state(robot(3.0))
    assert episodes.pending is None


def test_a_started_episode_takes_its_task_or_the_current_one_and_counts():
    episodes, _ = tracker(task="t0")
    assert episodes.state.task == "t0" and episodes.start_requested() is None
    episodes.executed(np.array([0, 0, 0, 0, 0, 0, 1.0]))
    assert (episodes.state.step_index, episodes.state.gripper_closed) == (1, True)
    episodes.request("by hand")
    request = episodes.start_requested()
    assert request == EpisodeRequest("by hand") and episodes.pending is None
    assert (episodes.state.task, episodes.state.step_index, episodes.started) == ("t0", 0, 1)
    episodes.request("other task", "t9")
    episodes.request("the last one counts", "t3")
    episodes.start_requested()
    assert (episodes.state.task, episodes.started) == ("t3", 2)
    episodes.set_task("")
    episodes.start_requested()
    assert episodes.state.task is None
