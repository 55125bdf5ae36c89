r"""The sim node: the MuJoCo PIPER behind the PIPER driver's topics, plus cameras and episodes.

The simulated arm (:class:`heisd_ros.sim.sim_robot.SimRobot`) is driven through the same
:class:`~heisd_ros.robot.controller.RobotController` as the real driver: deltas become
absolute targets inside the workspace box and per-step limits, and the strict gripper executes
a change only when ``gripper_from_target`` is true on ``gripper.hysteresis_steps`` consecutive
commands. The world runs in one of two modes (``mode``):

- **realtime** (the default, and the launch's): as a real PIPER, the world does not wait for
  the policy. Physics advances with the clock (``time_scale`` world seconds per wall second);
  the arm's servos track the latest accepted command (its joint ramp, then holding it); the
  cameras stream at ``third_person_rate_hz`` / ``wrist_rate_hz`` and the joint state and EE
  pose every ``state_period_s``, all in world time; the controller ticks at 50 Hz (gripper
  progress, watchdog). The episode ends by itself on success, on a controller fault, or
  after ``max_steps`` control periods of world time ("time_limit"). When physics and
  rendering fall more than ``max_lag_s`` behind the clock, the world is slowed (counted and
  warned) instead of catching up in a burst.
- **lockstep** (reproducible evaluation): each received command runs one control period of
  physics (``sim.control_rate_hz``), then both camera frames, the joint state, the EE pose
  and the episode status are published with one stamp. Nothing moves between commands.

Usage::

    ros2 run heisd_ros sim_node --ros-args \
        --params-file $(ros2 pkg prefix heisd_ros)/share/heisd_ros/config/sim_node.yaml \
        -p suite:=piper_goal -p task:=red_block_on_plate -p seed:=3
    ros2 param set /sim_node seed 7 && ros2 service call /sim_node/reset std_srvs/srv/Trigger

Interface:
    ``/heisd/ee_command`` (heisd_ros/msg/EECommand, in): one control step per message. Real
        time: a command on frames older than ``max_command_age_s`` when the arm would take
        it is refused and the arm holds, as on the driver.
    ``/diagnostics`` ("sim_node: commands", every second): steps run, commands ignored,
        refused for their age, taken although older (0 while the check is on), the oldest
        taken and the longest a command waited in this node before the arm took it (ms).
    ``/joint_states`` (sensor_msgs/JointState), ``/ee_pose`` (geometry_msgs/PoseStamped),
        as the driver publishes them: every ``state_period_s`` (lockstep: and after every
        step).
    ``/camera/third_person/image_raw``, ``/camera/wrist/image_raw`` (sensor_msgs/Image, rgb8):
        real time: each at its rate while an episode runs. Lockstep: after every step and at
        each episode start; when no command came for ``frame_republish_s`` the current
        frames are sent again with a fresh stamp (the scene has not moved), so a policy that
        started late or lost a frame gets going.
    ``/heisd/episode_status`` (heisd_ros/msg/EpisodeStatus, transient local: a late
        subscriber gets the latest): after every executed command and reset; ``step`` counts
        the executed commands; ``done`` with ``reason`` "success", "max_steps" (lockstep),
        "time_limit" or "fault" (real time); commands after that are ignored
        until the next episode. With ``auto_reset`` (the default) that starts by itself
        ``auto_reset_delay_s`` later, like a ``~/reset`` (the next seed; with
        ``auto_reset_next_task`` the suite's next task); without it, at ``~/reset``. Each
        episode has a new (suite, task, episode, seed) and starts at step 0, which is how the
        policy node tells episodes apart.
    ``~/reset`` (std_srvs/Trigger): start a new episode of the ``suite``/``task`` parameters
        (a new task rebuilds the scene) with the ``seed`` parameter; the next reset without a
        new ``seed`` uses seed + 1. ``suite``, ``task`` and ``seed`` are the only writable
        parameters; all others are read once at start.

Bad suite or task names never take the node down. At start they leave it up without an
episode: it logs an error naming the value and listing the valid names
(:mod:`heisd_ros.sim.suites`), publishes nothing, ignores commands and answers ``~/reset``
with ``success=False`` and the same message until the parameter is corrected
(``ros2 param set /sim_node task red_block_on_plate``, then ``~/reset``). While an episode
runs, a suite or task name that exists nowhere is refused by the parameter service; a task
that is not in the suite (e.g. half-way through switching both) is accepted, and a
``~/reset`` with it is refused with the message while the running episode goes on.

All MuJoCo work (physics, the EGL renderer) runs on one worker thread: a GL context belongs to
the thread that made it current, and executor callbacks may run on any thread. In real time
that thread also publishes the frames and states, so the executor only takes commands.
"""

from __future__ import annotations

import math
import queue
import threading
import time

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from geometry_msgs.msg import PoseStamped
from rcl_interfaces.msg import ParameterDescriptor, SetParametersResult
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.duration import Duration
from rclpy.node import Node
from rclpy.parameter import Parameter
from sensor_msgs.msg import Image, JointState
from std_srvs.srv import Trigger

from heisd_ros.msg import EECommand as EECommandMsg
from heisd_ros.msg import EpisodeStatus
from heisd_ros.nodes._params import dataclass_from_parameters
from heisd_ros.nodes.image_conversion import rgb_to_image
from heisd_ros.nodes.qos import STATUS_QOS
from heisd_ros.nodes.robot_msgs import ee_command_from_msg, ee_pose_msg, joint_state_msg
from heisd_ros.nodes.sim_params import (
    SIM_DIAGNOSTICS,
    SimNodeConfig,
    next_task,
    parameter_problem,
)
from heisd_ros.robot.controller import ControllerConfig, ControllerStatus, RobotController
from heisd_ros.robot.gripper import GripperConfig, GripperStateMachine
from heisd_ros.robot.safety import SafetyConfig, SafetyFilter
from heisd_ros.sim.config import SimConfig
from heisd_ros.sim.suites import get_task, list_suites, list_tasks

#: How often the command counters go to /diagnostics, s.
DIAGNOSTICS_PERIOD_S = 1.0
THIRD_PERSON_TOPIC = "/camera/third_person/image_raw"
WRIST_TOPIC = "/camera/wrist/image_raw"
_CAMERAS = ("third_person", "wrist")  # in the order of the image publishers
_RESET_TIMEOUT_S = 60.0
#: Real time: the controller's tick (gripper progress, watchdog, faults) and the episode's
#: success check run this often, world s (the driver ticks at 50 Hz).
TICK_S = 0.02
_EPS_S = 1e-6  # world times this close count as equal


class SimNode(Node):
    """Simulated PIPER with cameras: the world runs with the clock, or one step per command."""

    def __init__(self, node_name: str = "sim_node", **kwargs) -> None:
        """Declare parameters, start the sim worker (it builds the scene and resets).

        A bad ``suite`` or ``task`` does not raise: the node stays up without an episode and
        reports it (module docstring, ``config_error``).

        Args:
            node_name: default node name (remappable with ``__node:=``).
            **kwargs: passed to :class:`rclpy.node.Node` (``context``,
                ``parameter_overrides``, ...).

        Raises:
            ValueError: another parameter is invalid (the message names it).
        """
        super().__init__(node_name, **kwargs)
        # One descriptor each: declare_parameter writes the value's type into the descriptor,
        # so a shared one would type `suite` and `task` as integers after `seed`.
        for name, default in (("suite", "piper_goal"), ("task", "red_block_on_plate"),
                              ("seed", 0)):
            self.declare_parameter(name, default, ParameterDescriptor(read_only=False))
        self._next_seed = int(self.get_parameter("seed").value)
        self.config = dataclass_from_parameters(self, SimNodeConfig)
        self.sim_config = dataclass_from_parameters(self, SimConfig, "sim")
        self.safety_config = dataclass_from_parameters(self, SafetyConfig, "safety",
                                                       defaults={"frame_id": self.config.frame_id})
        self.gripper_config = dataclass_from_parameters(self, GripperConfig, "gripper")
        self.add_on_set_parameters_callback(self._on_set_parameters)

        self._group = MutuallyExclusiveCallbackGroup()
        self._joint_pub = self.create_publisher(JointState, "/joint_states", 10)
        self._pose_pub = self.create_publisher(PoseStamped, "/ee_pose", 10)
        self._image_pubs = (self.create_publisher(Image, THIRD_PERSON_TOPIC, 2),
                            self.create_publisher(Image, WRIST_TOPIC, 2))
        # Latched (transient local): a policy that starts later still learns the episode.
        self._status_pub = self.create_publisher(EpisodeStatus, "/heisd/episode_status",
                                                 STATUS_QOS)
        self.create_subscription(EECommandMsg, "/heisd/ee_command", self._on_command, 10,
                                 callback_group=self._group)
        self.create_service(Trigger, "~/reset", self._on_reset, callback_group=self._group)
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.create_timer(DIAGNOSTICS_PERIOD_S, self._publish_diagnostics,
                          callback_group=MutuallyExclusiveCallbackGroup())
        self.realtime = self.config.mode == "realtime"
        if not self.realtime:  # real time: the physics thread publishes the state
            self.create_timer(self.config.state_period_s, self._publish_state,
                              callback_group=MutuallyExclusiveCallbackGroup())

        self._jobs: queue.Queue = queue.Queue()
        self._state = None  # latest RobotState (immutable), read by the state timer
        self._frames = None  # latest (third_person, wrist) RGB frames
        self._status = EpisodeStatus()
        self._env = self._robot = self._controller = None  # no controller = no episode
        self.config_error = ""  # why the last reset failed; "" once one succeeded
        self._auto_reset_at: float | None = None  # time.monotonic() of the automatic reset
        self.steps_run = 0
        self.commands_ignored = 0
        #: Real time: commands refused for their age (``max_command_age_s``), commands the
        #: arm took although older (0 while the check is on), the oldest one taken, ms.
        self.commands_refused_age = 0
        self.commands_executed_past_age = 0
        self.max_executed_age_ms = 0.0
        #: Real time: the longest a command waited between its arrival and the arm, ms.
        self.max_command_wait_ms = 0.0
        #: Real time: frames published per camera, frames skipped because the thread was
        #: late, times the world was slowed (max_lag_s), and the wall time spent rendering
        #: and in physics, s.
        self.frames_published = [0, 0]
        self.frames_skipped = 0
        self.world_slowed = 0
        self.render_s = self.physics_s = 0.0
        self._anchor = None  # real time: (wall, world) anchor of the world clock
        self._next_frame = [math.inf, math.inf]  # world time of each camera's next frame
        self._next_state = self._next_tick = math.inf
        self._episode_start = 0.0  # world time of the episode's start
        self._worker = threading.Thread(target=self._work, name="sim_node-mujoco", daemon=True)
        self._worker.start()
        done = self._submit("reset")
        if not done.wait(_RESET_TIMEOUT_S):
            self.config_error = "sim not started: the first reset timed out"
            self.get_logger().error(self.config_error)

    # ------------------------------------------------------------------ parameters
    def _on_set_parameters(self, params) -> SetParametersResult:
        values = {p.name: p.value for p in params}
        suite = values.get("suite", self.get_parameter("suite").value)
        for name in ("seed", "suite", "task"):
            problem = parameter_problem(name, values[name], suite) if name in values else ""
            if problem:
                self.get_logger().error(f"parameter not set: {problem}")
                return SetParametersResult(successful=False, reason=problem)
        if "seed" in values:
            self._next_seed = int(values["seed"])
        task = values.get("task", self.get_parameter("task").value)
        if ({"suite", "task"} & set(values) and suite in list_suites()
                and task not in list_tasks(suite)):
            self.get_logger().warning(f"task {task!r} is not in suite {suite!r} (valid: "
                                      f"{list_tasks(suite)}): set both before ~/reset")
        return SetParametersResult(successful=True)

    # ------------------------------------------------------------------ callbacks
    def _on_command(self, msg: EECommandMsg) -> None:
        # With the ROS clock at arrival: how late a refused command came is logged.
        self._submit("command", (msg, self.get_clock().now().nanoseconds * 1e-9))

    def _on_reset(self, _request: Trigger.Request, response: Trigger.Response):
        done = self._submit("reset")
        if not done.wait(_RESET_TIMEOUT_S):
            response.success, response.message = False, "reset timed out"
        elif done.error:
            response.success, response.message = False, done.error
        else:
            s = self._status
            response.success = True
            response.message = f"episode {s.episode}: {s.suite}/{s.task} seed {s.seed}"
        return response

    def _stamp(self, world_s: float | None = None):
        """Now on the ROS clock; real time: when the clock says world time ``world_s`` was.

        A frame or state the worker takes late (physics and rendering behind the clock)
        carries the time it shows, not the time it was sent, so its age downstream (the
        policy's input gate, the command age) counts the lateness.
        """
        now = self.get_clock().now()
        if world_s is not None and self._anchor is not None:
            late_s = (self._world_now() - world_s) / self.config.time_scale
            if late_s > 0:
                now = now - Duration(nanoseconds=int(late_s * 1e9))
        return now.to_msg()

    def _publish_state(self, world_s: float | None = None) -> None:
        state = self._state
        if state is None:
            return
        stamp = self._stamp(world_s)
        cfg = self.config
        self._joint_pub.publish(joint_state_msg(state, stamp, cfg.joint_names,
                                                cfg.gripper_joint_name))
        self._pose_pub.publish(ee_pose_msg(state, stamp, cfg.frame_id))

    # ------------------------------------------------------------------ the sim worker
    def _submit(self, kind: str, payload=None) -> _Job:
        job = _Job(kind, payload)
        self._jobs.put(job)
        return job

    def _work(self) -> None:
        """Own the env (physics + GL context): run jobs in order, and the world between them.

        Real time: the world runs up to the clock before each job and whenever its next event
        is due. Lockstep: when idle the frames are republished. An automatic reset is due
        ``auto_reset_delay_s`` after an episode ended; the queue wait is cut short for it,
        and a ``~/reset`` before then replaces it.
        """
        idle_s = self.config.frame_republish_s or None
        while True:
            wait = self._realtime_wait_s() if self.realtime else self._wait_s(idle_s)
            try:
                job = self._jobs.get(timeout=wait)
            except queue.Empty:
                job = None
                if self._auto_reset_at is not None and time.monotonic() >= self._auto_reset_at:
                    job = _Job("auto_reset")
                elif not self.realtime:
                    if self._frames is not None and not self._status.done:
                        self._publish_frames()
                    continue
            if job is not None and job.kind == "stop":
                break
            if self.realtime:
                self._run_world()  # up to now first: a command applies at the current time
            if job is not None:
                self._run_job(job)

        self._close_env()

    def _run_job(self, job: _Job) -> None:
        """Run one reset or command; a failure is logged and handed to whoever waits."""
        try:
            if job.kind in ("reset", "auto_reset"):
                self._reset(auto=job.kind == "auto_reset")
                self.config_error = ""
            elif self.realtime:
                self._command_realtime(*job.payload)
            else:
                self._step(job.payload[0])
        except (ValueError, RuntimeError) as exc:  # bad task name, IK/scene errors
            job.error = self._failure(job.kind, exc)
            self.get_logger().error(job.error)
        job.set()

    # ------------------------------------------------------------------ real time
    def _world_now(self) -> float:
        """World time the clock says it is now (the episode's anchor scaled), s."""
        wall, world = self._anchor
        return world + (time.monotonic() - wall) * self.config.time_scale

    def _realtime_wait_s(self) -> float | None:
        """How long the worker may wait for a job: until the world's next event is due."""
        if self._controller is None or self._status.done or self._anchor is None:
            return self._wait_s(None)
        due = min(self._next_tick, self._next_state, *self._next_frame)
        wall, world = self._anchor
        wait = max(0.0, wall + (due - world) / self.config.time_scale - time.monotonic())
        return self._wait_s(wait)

    def _run_world(self) -> None:
        """Advance physics to the clock's world time, with the ticks, frames and states due."""
        if self._controller is None or self._status.done or self._anchor is None:
            return
        env, cfg = self._env, self.config
        target = self._world_now()
        if target - env.data.time > cfg.max_lag_s:  # late: slow the world, no burst
            self.world_slowed += 1
            self.get_logger().warning(
                f"the sim is {target - env.data.time:.2f} s of world time behind the clock "
                f"(physics and rendering cannot keep time_scale {cfg.time_scale:g} on this "
                f"machine): the world slows down", throttle_duration_sec=5.0)
            self._anchor = (time.monotonic(), env.data.time)
            target = env.data.time
        dt = env.config.physics_timestep_s
        while not self._status.done:
            due = min(self._next_tick, self._next_state, *self._next_frame)
            if due > target + _EPS_S:
                break
            steps = max(0, math.ceil((due - env.data.time - _EPS_S) / dt))  # reach `due`
            if steps:
                started = time.perf_counter()
                env.advance(steps)
                self.physics_s += time.perf_counter() - started
            now = env.data.time + _EPS_S
            if now >= self._next_tick:
                self._next_tick += TICK_S
                self._tick_realtime()
            for i, name in enumerate(_CAMERAS):
                if not self._status.done and now >= self._next_frame[i]:
                    self._publish_camera(i, name, now)
            if now >= self._next_state:
                self._next_state = self._next_after(self._next_state, cfg.state_period_s, now)
                self._state = self._robot.observe()
                self._publish_state(now)

    def _next_after(self, due: float, period: float, now: float) -> float:
        """The next multiple of ``period`` after ``due`` that is later than ``now``."""
        return due + period * max(1, math.floor((now - due) / period + 1e-9) + 1)

    def _publish_camera(self, index: int, name: str, now: float) -> None:
        rates = (self.config.third_person_rate_hz, self.config.wrist_rate_hz)
        period = 1.0 / rates[index]
        following = self._next_after(self._next_frame[index], period, now)
        self.frames_skipped += int(round((following - self._next_frame[index]) / period)) - 1
        self._next_frame[index] = following
        started = time.perf_counter()
        frame = self._env.render_camera(name)
        self.render_s += time.perf_counter() - started
        msg = rgb_to_image(frame)
        msg.header.stamp, msg.header.frame_id = self._stamp(now), self.config.frame_id
        self._image_pubs[index].publish(msg)
        self.frames_published[index] += 1

    def _tick_realtime(self) -> None:
        """The controller's periodic work, then the episode's end conditions."""
        result = self._controller.tick(self._robot.now_s())
        status, now = self._status, self._env.data.time
        if self._env.success():
            self._end_episode(True, "success")
        elif result.status in (ControllerStatus.FAULT, ControllerStatus.ESTOP):
            self._end_episode(False, "fault", result.detail)
        elif now - self._episode_start >= status.max_steps / self._env.config.control_rate_hz:
            self._end_episode(False, "time_limit")

    def _command_realtime(self, msg: EECommandMsg, arrived_clock_s: float) -> None:
        """Hand an accepted command to the arm's servos; physics runs on with the clock.

        Its age is taken here, on the MuJoCo thread, when the arm would take it: the time
        it waited in the job queue counts.
        """
        command = self._admit(msg)
        if command is None:
            return
        clock_s = self.get_clock().now().nanoseconds * 1e-9
        wait_ms = (clock_s - arrived_clock_s) * 1e3
        self.max_command_wait_ms = max(self.max_command_wait_ms, wait_ms)
        age_ms = (clock_s - command.stamp_s) * self.config.time_scale * 1e3   # world time
        limit_ms = (self.config.max_command_age_s or math.inf) * 1e3
        result = self._controller.step(command, self._robot.now_s(), clock_s)
        if result.rejected_reason:
            self.commands_refused_age += age_ms > limit_ms
            arrived_ms = (arrived_clock_s - command.stamp_s) * self.config.time_scale * 1e3
            self.get_logger().warning(f"command {command.step_index}: {result.rejected_reason} "
                                      f"(arrived {arrived_ms:.0f} ms after its stamp, then "
                                      f"waited {wait_ms:.0f} ms here)",
                                      throttle_duration_sec=2.0)
        if result.sent is None:
            return
        self.commands_executed_past_age += age_ms > limit_ms
        self.max_executed_age_ms = max(self.max_executed_age_ms, age_ms)
        self.steps_run += 1
        self._status.step += 1
        self._status.header.stamp = self.get_clock().now().to_msg()
        self._status_pub.publish(self._status)

    def _schedule_next_episode(self) -> str:
        """After an episode ended: schedule the automatic reset if on; what happens next."""
        if not self.config.auto_reset:
            return "call ~/reset for the next"
        # the end stands for the delay from its publication
        self._auto_reset_at = time.monotonic() + self.config.auto_reset_delay_s
        return f"the next starts in {self.config.auto_reset_delay_s:g} s"

    def _end_episode(self, success: bool, reason: str, detail: str = "") -> None:
        """Mark the episode over, publish it, schedule the automatic reset and say so."""
        status = self._status
        status.done, status.success, status.reason = True, success, reason
        self._state = self._robot.observe()
        status.header.stamp = self.get_clock().now().to_msg()
        self._status_pub.publish(status)
        self._publish_state()
        then = self._schedule_next_episode()
        how = f"{reason} ({detail})" if detail else reason
        world_s = self._env.data.time - self._episode_start
        frames = sum(self.frames_published) or 1
        self.get_logger().info(
            f"episode {status.episode} over after {world_s:.1f} s (world) and {status.step} "
            f"commands ({status.step / max(world_s, 1e-9):.1f}/s): {how}; {then}; so far "
            f"{self.render_s / frames * 1e3:.1f} ms per frame rendered, "
            f"{self.frames_skipped} frames skipped, the world slowed {self.world_slowed} times")

    def _wait_s(self, idle_s: float | None) -> float | None:
        """How long the worker may wait for a job: until the idle republish or the auto reset."""
        if self._auto_reset_at is None:
            return idle_s
        until_reset = max(0.0, self._auto_reset_at - time.monotonic())
        return until_reset if idle_s is None else min(idle_s, until_reset)

    def _failure(self, kind: str, exc: Exception) -> str:
        """The message of a failed job; a failed reset is also kept in ``config_error``."""
        if kind == "auto_reset":
            self.config_error = (f"automatic reset failed: {exc}; fix it (ros2 param set "
                                 f"{self.get_fully_qualified_name()} suite|task <name>), then "
                                 f"call ~/reset")
            return self.config_error
        if kind != "reset":
            return f"{kind} failed: {exc}"
        if self._controller is None:
            self.config_error = (f"sim not started: {exc}; fix it (ros2 param set "
                                 f"{self.get_fully_qualified_name()} suite|task <name>), then "
                                 f"call ~/reset")
        else:
            self.config_error = (f"reset refused: {exc}; episode {self._status.episode} of "
                                 f"{self._status.task} goes on")
        return self.config_error

    def _close_env(self) -> None:
        """Close the scene; no episode runs until the next successful reset."""
        if self._env is not None:
            self._env.close()
        self._env = self._robot = self._controller = None
        self._state = self._frames = None

    def _reset(self, auto: bool = False) -> None:
        """Start an episode; ``auto``: the automatic one after an episode ended."""
        from heisd_ros.sim.env import PiperSimEnv
        from heisd_ros.sim.sim_robot import SimRobot

        self._auto_reset_at = None  # a reset of any kind replaces a pending automatic one
        suite = str(self.get_parameter("suite").value)
        if auto and self.config.auto_reset_next_task:
            # Through the parameter, so `ros2 param get` and a later ~/reset agree with it.
            task = next_task(suite, str(self.get_parameter("task").value))
            self.set_parameters([Parameter("task", value=task)])
        # ValueError names the bad suite or task and lists the valid ones; nothing changed yet.
        task = get_task(suite, str(self.get_parameter("task").value))
        self._controller = None  # from here on the old episode is gone, even if this fails
        if self._env is None or self._env.task.name != task.name:
            self._close_env()
            self._env = PiperSimEnv(task, self.sim_config)
            self._robot = SimRobot(self._env, realtime=self.realtime)
            self._robot.connect()
        seed = self._next_seed
        self._next_seed = seed + 1
        observation = self._env.reset(seed)
        self._robot.reset_episode()
        self._robot.clear_estop()
        tracking = self.config.max_tracking_error_m or None
        # Stamps are on the ROS (wall) clock; the limit is world time, as on the robot.
        max_age = (self.config.max_command_age_s / self.config.time_scale
                   if self.realtime and self.config.max_command_age_s else None)
        self._controller = RobotController(
            self._robot, SafetyFilter(self.safety_config),
            GripperStateMachine(self.gripper_config),
            ControllerConfig(tracking, max_command_age_s=max_age))
        self._controller.start(self._robot.now_s())
        previous = self._status
        self._status = EpisodeStatus(
            suite=suite, task=task.name, instruction=task.instruction,
            episode=previous.episode + 1 if previous.task else 0, seed=seed, step=0,
            max_steps=self.config.max_steps or task.max_steps)
        self._frames = (observation.image_primary, observation.image_wrist)
        self._state = self._robot.observe()
        self.get_logger().info(f"episode {self._status.episode}: {suite}/{task.name} seed "
                               f"{seed}: {task.instruction!r}")
        self._publish_all()
        if self.realtime:  # the world's clock starts now, with the frames just sent
            now = self._episode_start = self._env.data.time
            self._anchor = (time.monotonic(), now)
            self._next_tick = now + TICK_S
            self._next_state = now + self.config.state_period_s
            self._next_frame = [now + 1.0 / self.config.third_person_rate_hz,
                                now + 1.0 / self.config.wrist_rate_hz]
            self.frames_published = [n + 1 for n in self.frames_published]

    def _admit(self, msg: EECommandMsg):
        """The command of ``msg``, or None (counted and said why) when none may run now."""
        status = self._status
        if self._controller is None:
            self.commands_ignored += 1
            self.get_logger().warning(f"no episode: command ignored ({self.config_error})",
                                      throttle_duration_sec=5.0)
            return None
        if status.done:
            self.commands_ignored += 1
            self.get_logger().warning(f"episode over ({status.reason}): command ignored until "
                                      f"the next episode", throttle_duration_sec=5.0)
            return None
        try:
            return ee_command_from_msg(msg)
        except ValueError as exc:
            self.commands_ignored += 1
            self.get_logger().warning(f"command refused: {exc}", throttle_duration_sec=2.0)
            return None

    def _step(self, msg: EECommandMsg) -> None:
        """Lockstep: run the command for one control period, then publish everything."""
        status = self._status
        command = self._admit(msg)
        if command is None:
            return
        before = self._robot.steps
        result = self._controller.step(command, self._robot.now_s())
        if result.rejected_reason:
            self.get_logger().warning(f"command {command.step_index}: {result.rejected_reason}",
                                      throttle_duration_sec=2.0)
        if self._robot.steps == before:
            return  # no physics ran (fault, disabled): the idle republish keeps the loop alive
        self.steps_run += 1
        last = self._robot.last_step
        self._frames = (last.observation.image_primary, last.observation.image_wrist)
        self._state = last.state
        status.step += 1
        if last.success:
            status.done, status.success, status.reason = True, True, "success"
        elif status.step >= status.max_steps:
            status.done, status.reason = True, "max_steps"
        self._publish_all()
        if status.done:
            then = self._schedule_next_episode()
            self.get_logger().info(f"episode {status.episode} over after {status.step} steps: "
                                   f"{status.reason}; {then}")

    def _publish_frames(self, stamp=None) -> None:
        stamp = stamp or self.get_clock().now().to_msg()
        for pub, frame in zip(self._image_pubs, self._frames, strict=True):
            msg = rgb_to_image(frame)
            msg.header.stamp, msg.header.frame_id = stamp, self.config.frame_id
            pub.publish(msg)

    def _publish_diagnostics(self) -> None:
        """The command counters on /diagnostics ("sim_node: commands")."""
        values = {"steps_run": self.steps_run, "commands_ignored": self.commands_ignored,
                  "commands_refused_age": self.commands_refused_age,
                  "commands_executed_past_age": self.commands_executed_past_age,
                  "max_executed_age_ms": f"{self.max_executed_age_ms:.1f}",
                  "max_command_wait_ms": f"{self.max_command_wait_ms:.1f}",
                  "max_command_age_s": self.config.max_command_age_s if self.realtime else 0}
        status = DiagnosticStatus(name=SIM_DIAGNOSTICS, hardware_id="mujoco",
                                  level=DiagnosticStatus.OK, message=self._status.reason or "ok",
                                  values=[KeyValue(key=k, value=str(v)) for k, v in
                                          values.items()])
        msg = DiagnosticArray(status=[status])
        msg.header.stamp = self.get_clock().now().to_msg()
        self._diag_pub.publish(msg)

    def _publish_all(self) -> None:
        # The state goes first, so a policy that steps on the frames has the matching state.
        stamp = self.get_clock().now().to_msg()
        cfg, state = self.config, self._state
        self._joint_pub.publish(joint_state_msg(state, stamp, cfg.joint_names,
                                                cfg.gripper_joint_name))
        self._pose_pub.publish(ee_pose_msg(state, stamp, cfg.frame_id))
        self._status.header.stamp = stamp
        self._status_pub.publish(self._status)
        self._publish_frames(stamp)

    @property
    def episode_status(self) -> EpisodeStatus:
        """The current episode's status message."""
        return self._status

    def destroy_node(self) -> None:
        """Stop the worker (it closes the renderer), then the node."""
        self._jobs.put(_Job("stop"))
        self._worker.join(timeout=10.0)
        super().destroy_node()


class _Job(threading.Event):
    """One unit of work for the sim thread; ``wait()`` until it ran, then read ``error``."""

    def __init__(self, kind: str, payload=None) -> None:
        super().__init__()
        self.kind, self.payload, self.error = kind, payload, ""


def main(args: list[str] | None = None) -> None:
    """Run the node until Ctrl-C, SIGTERM or ROS shutdown."""
    from heisd_ros.nodes._spin import spin_node

    spin_node(SimNode, args)


if __name__ == "__main__":
    main()
