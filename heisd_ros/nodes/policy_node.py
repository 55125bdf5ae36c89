r"""The policy node: camera frames + robot state in, one EE command per decoded action out.

A thin adapter: images are converted (:mod:`heisd_ros.nodes.image_conversion`), the input
gate (:mod:`heisd_ros.nodes.policy_inputs`) pairs the newest frames and refuses stale or
malformed input, the decoder of the configured ``method`` (:mod:`heisd_ros.nodes.
policy_decoders`) decodes, and the node publishes the messages of
:mod:`heisd_ros.nodes.policy_messages`, :mod:`heisd_ros.nodes.policy_viz` and
:mod:`heisd_ros.nodes.policy_diagnostics`. Its own settings: :mod:`heisd_ros.nodes.
policy_config`.

Usage::

    ros2 run heisd_ros policy_node --ros-args \
        --params-file $(ros2 pkg prefix heisd_ros)/share/heisd_ros/config/policy_node.yaml \
        -p method:=heisd -p model.path:=small_vla.safetensors \
        -p model.drafter_path:=draft_head.safetensors -p instruction:="put the red block ..."
    ros2 run heisd_ros policy_node --ros-args \
        --params-file $(ros2 pkg prefix heisd_ros)/share/heisd_ros/config/policy_node.yaml \
        -p model.type:=openvla -p model.checkpoint:=/ckpt/openvla-7b-finetuned-libero-spatial \
        -p model.unnorm_key:=libero_spatial -p model.center_crop:=true \
        -p model.drafter_path:=draft_head_openvla.safetensors -p model.db_dir:=db_openvla
    ros2 service call /policy_node/set_instruction heisd_ros/srv/SetInstruction \
        "{instruction: 'put the blue block in the basket', task: ''}"

Interface:
    in: ``/camera/third_person/image_raw`` and ``/camera/wrist/image_raw`` (sensor_msgs/Image
        rgb8/bgr8/mono8, or CompressedImage jpeg/png on ``<topic>/compressed`` with
        ``image_transport: compressed``); ``/joint_states`` and ``/ee_pose`` (as the driver
        and the sim node publish them); ``/heisd/episode_status`` (sim episodes: a new
        episode resets the decoder's episode state, an ended one reports its outcome; with
        an empty ``instruction`` the episode's instruction and task are used).
    out: ``/heisd/ee_command`` (heisd_ros/msg/EECommand, one per step, header stamp = the
        observation's stamp); ``/heisd/hybrid_step`` (heisd_ros/msg/HybridStep);
        ``/heisd/ee_path`` (nav_msgs/Path of the executed EE positions);
        ``/heisd/router_markers`` (visualization_msgs/MarkerArray, see policy_viz);
        ``/diagnostics`` (configuration, refusals by kind, latency p50/p99 from image stamp
        to command publish and the ROS share of it).
    ``~/set_instruction`` (heisd_ros/srv/SetInstruction); the ``instruction`` and ``task``
        parameters are writable too. All other parameters are read once at start.

Models load in the configure step at start. A bad path or model does not kill the node: it
stays up, publishes nothing but diagnostics, and logs and reports the reason. So does an
OpenVLA target on a CPU without ``model.allow_cpu`` (refused before any weight is read; see
``heisd_ros.models.loading``). Input the gate
refuses (wrong encoding, mismatched sizes, NaN state, frames from the future or too old)
produces one throttled warning per kind, named by the rule, and no command.

Every hold says why. A command whose frames are older than ``max_command_age_s`` when the
decoder is done is not sent ("stale command"). When nothing happens for ``input_timeout_s``
(no command, no refusal) the node names what it waits for: a silent or never-heard camera or
robot-state topic, or the instruction ("waiting for input"). /diagnostics shows the live
problem (WARN) and returns to OK with the next command sent; ``last_refusal`` keeps the last
reason for later reading.

A new episode (new key or a restart of the same one on /heisd/episode_status, a call of
``~/set_instruction``, or an EE jump of more than ``episode_jump_m`` between two robot states)
resets the per-episode state (router history, drafts, gripper state, path) before the next
step, in the step's own thread.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from dataclasses import asdict

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from geometry_msgs.msg import PoseStamped
from nav_msgs.msg import Path
from rcl_interfaces.msg import ParameterDescriptor, SetParametersResult
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.exceptions import InvalidHandle
from rclpy.node import Node
from sensor_msgs.msg import CompressedImage, Image, JointState
from visualization_msgs.msg import MarkerArray

from heisd_ros.data.episode import make_proprio
from heisd_ros.data.observation import EpisodeState, Observation
from heisd_ros.msg import EECommand, EpisodeStatus, HybridStep
from heisd_ros.nodes._params import dataclass_from_parameters
from heisd_ros.nodes.decode_worker import DecodeWorker, WorkerError, WorkerSpec
from heisd_ros.nodes.image_conversion import ImageConversionError, compressed_to_rgb, image_to_rgb
from heisd_ros.nodes.policy_config import PolicyNodeConfig
from heisd_ros.nodes.policy_decoders import (
    DecodedStep,
    ModelConfig,
    build_decoder,
    load_target,
    warm_up,
)
from heisd_ros.nodes.policy_diagnostics import StepLatency, policy_status
from heisd_ros.nodes.policy_inputs import InputGate, InputGateConfig, RobotInput
from heisd_ros.nodes.policy_messages import (
    command_msg,
    hybrid_step_msg,
    robot_input,
    robot_pose_msg,
)
from heisd_ros.nodes.policy_viz import append_pose, step_markers
from heisd_ros.nodes.qos import STATUS_QOS
from heisd_ros.nodes.retrieval_client import RetrievalServiceClient
from heisd_ros.nodes.robot_msgs import seconds_to_stamp, stamp_to_seconds
from heisd_ros.srv import SetInstruction

__all__ = ["PolicyNode", "main"]

#: Longest wait at shutdown for a step under way, s (then the worker is stopped under it).
STEP_JOIN_TIMEOUT_S = 5.0
#: Decoded steps before the node judges whether this machine is too slow for its limit.
TOO_SLOW_MIN_STEPS = 10


class InThreadDecoder:
    """A decoder run in the step thread (``decode_worker: false``), with the worker's API.

    ``submit`` keeps the observation and ``result`` decodes it, so the node's step loop is
    the same for both; attributes (``description``, ``degraded``, ...) are the decoder's.
    """

    def __init__(self, decoder) -> None:
        self.decoder = decoder
        self._observation = None

    def __getattr__(self, name: str):
        return getattr(self.decoder, name)

    def submit(self, observation) -> None:
        """Decode ``observation`` at the next :meth:`result`."""
        self._observation = observation

    def result(self) -> DecodedStep:
        """The step of the submitted observation (decoded now, in this thread)."""
        observation, self._observation = self._observation, None
        return self.decoder.decode(observation)


class PolicyNode(Node):
    """Runs the VLA decoder on paired camera frames; one EE command per step."""

    def __init__(self, node_name: str = "policy_node", **kwargs) -> None:
        """Declare parameters, subscribe, then configure (load the models).

        Args:
            node_name: default node name (remappable with ``__node:=``).
            **kwargs: passed to :class:`rclpy.node.Node` (``context``,
                ``parameter_overrides``, ...).
        """
        super().__init__(node_name, **kwargs)
        writable = ParameterDescriptor(read_only=False)
        self.instruction = str(self.declare_parameter("instruction", "", writable).value)
        self.task = str(self.declare_parameter("task", "", writable).value)
        self.config_error = ""
        self.config = PolicyNodeConfig()
        self.model_config = ModelConfig()
        try:
            self.config = dataclass_from_parameters(self, PolicyNodeConfig)
            gate_config = dataclass_from_parameters(self, InputGateConfig, "input")
            self.model_config = dataclass_from_parameters(self, ModelConfig, "model")
        except ValueError as exc:
            gate_config = InputGateConfig()
            self.config_error = f"policy not configured: {exc}"
        self.add_on_set_parameters_callback(self._on_set_parameters)
        cfg = self.config
        self.gate = InputGate(gate_config)
        self.decoder = None
        self.model_description = ""
        self.refusals: Counter[str] = Counter()
        self.last_problem = ""  # the live problem: cleared by the next command sent
        self.last_refusal = ""  # the last reason ever given, for diagnostics
        # node clock of the last command or refusal (start counts as one), s
        self._last_activity_t = self._now()
        self._received: dict[str, float] = {}  # input -> node clock of its last message, s
        self._episode_request: tuple[str, str | None, float | None] | None = None
        self._episode_status_progress: tuple[int, bool] | None = None  # (step, done)
        self._last_ee_m = None
        self.episodes_started = 0
        self._warned_at: dict[str, float] = {}
        self._lock = threading.Lock()  # gate + robot state between input and step callbacks
        self._joint: JointState | None = None
        self._pose: PoseStamped | None = None
        self._step_index = 0
        #: The episode as the driver got it: advanced only by a published command.
        self._episode = EpisodeState(self.task or None)
        self._episode_key: tuple | None = None
        self._episode_ended = False
        self._last_step_t = -math.inf
        self.latency = StepLatency(cfg.latency_window)
        self.commands_sent = 0
        self._path = Path()

        self._input_group = MutuallyExclusiveCallbackGroup()
        self._client_group = MutuallyExclusiveCallbackGroup()
        self._cmd_pub = self.create_publisher(EECommand, "/heisd/ee_command", 10)
        self._step_pub = self.create_publisher(HybridStep, "/heisd/hybrid_step", 10)
        self._path_pub = self.create_publisher(Path, "/heisd/ee_path", 1)
        self._marker_pub = self.create_publisher(MarkerArray, "/heisd/router_markers", 10)
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        image_type = Image if cfg.image_transport == "raw" else CompressedImage
        suffix = "" if cfg.image_transport == "raw" else "/compressed"
        for camera, topic in (("third_person", cfg.third_person_topic),
                              ("wrist", cfg.wrist_topic)):
            self.create_subscription(image_type, topic + suffix,
                                     lambda msg, c=camera: self._on_image(c, msg), 2,
                                     callback_group=self._input_group)
        # The robot state is taken, not spun: the PIPER driver publishes /joint_states and
        # /ee_pose at 200 Hz, and an executor wake-up per message (rclpy's Python wait-set
        # and dispatch work) kept this process busy and the step thread waiting for the GIL.
        # The subscriptions sit on a helper node that no executor spins; each step (and each
        # diagnostics tick) takes the newest message of each (:meth:`_take_robot_state`).
        self._state_node = Node(f"{self.get_name()}_robot_state",
                                namespace=self.get_namespace(), context=self.context,
                                start_parameter_services=False)
        self._state_lock = threading.Lock()
        self._state_subs = {
            "joint_states": self._state_node.create_subscription(
                JointState, "/joint_states", self._on_joint_state, 1),
            "ee_pose": self._state_node.create_subscription(
                PoseStamped, "/ee_pose", self._on_pose, 1),
        }
        self.create_subscription(EpisodeStatus, "/heisd/episode_status", self._on_episode,
                                 STATUS_QOS, callback_group=self._input_group)
        self.create_service(SetInstruction, "~/set_instruction", self._on_set_instruction,
                            callback_group=self._input_group)
        # Steps run in a thread of their own, woken by new frames and episode requests: no
        # executor thread is parked for a whole decode, and the executor has only quick
        # callbacks left (one thread spins it; see main()). A failed step is re-raised in
        # the executor (:meth:`_raise_step_failure`), so the process stops as it would for
        # any failed callback.
        self._wake = threading.Event()
        self._stopping = False
        self._step_failure: BaseException | None = None
        self._failure_gc = self.create_guard_condition(self._raise_step_failure)
        self._step_thread = threading.Thread(target=self._step_loop, name="policy_step",
                                             daemon=True)
        self.create_timer(cfg.diagnostics_period_s, self._publish_diagnostics,
                          callback_group=self._input_group)
        # With a decode worker the worker holds the retrieval client (its own small node).
        self.retrieval = None if cfg.decode_worker else RetrievalServiceClient(
            self, cfg.retrieval_service, callback_group=self._client_group)
        self.too_slow_warning = ""  # said once, then kept in /diagnostics (``too_slow``)
        if not self.config_error:
            self.configure()
        if self.config_error:
            self.get_logger().error(self.config_error)
        self._step_thread.start()

    # ------------------------------------------------------------------ configure
    def configure(self) -> bool:
        """Load the target and build the decoder; on failure keep the reason, act on nothing."""
        if self.config.decode_worker:
            return self._configure_worker()
        try:
            target, self.model_description = load_target(self.model_config)
            self.decoder = build_decoder(self.config.method, target, self.model_config,
                                         self.retrieval, warn=self.get_logger().warning)
            warm_up(target)
        except (OSError, ValueError, ImportError, RuntimeError, KeyError) as exc:
            # OSError: missing file; ValueError: wrong format/sizes/method; ImportError: a
            # decoder not installed; RuntimeError/KeyError: torch failing on a broken file.
            self.decoder = None
            self.config_error = f"policy not configured: {type(exc).__name__}: {exc}"
            return False
        self.decoder = InThreadDecoder(self.decoder)
        self.config_error = ""
        self.get_logger().info(f"policy configured: method {self.config.method!r}, target "
                               f"{self.model_description}; decoder "
                               f"{getattr(self.decoder, 'description', '')}")
        self.get_logger().info("acting on " + self._inputs_text())
        return True

    def _configure_worker(self) -> bool:
        """Start the decode worker process; it loads the models (``decode_worker`` module)."""
        spec = WorkerSpec(method=self.config.method, model=asdict(self.model_config),
                          retrieval_service=self.resolve_service_name(
                              self.config.retrieval_service),
                          node_name=self.get_name(), namespace=self.get_namespace())
        loggers = {"debug": self.get_logger().debug, "info": self.get_logger().info,
                   "warning": self.get_logger().warning, "error": self.get_logger().error}
        try:
            self.decoder = DecodeWorker(spec, lambda level, text: loggers[level](text))
        except WorkerError as exc:
            self.decoder = None
            self.config_error = f"policy not configured: {exc}"
            return False
        self.model_description = self.decoder.target_description
        self.config_error = ""
        self.get_logger().info(f"policy configured: method {self.config.method!r}, target "
                               f"{self.model_description}; decoder {self.decoder.description}")
        self.get_logger().info("acting on " + self._inputs_text())
        return True

    @property
    def retrieval_available(self) -> bool | None:
        """Whether the retrieval service answered the last call (None: unknown, or unused)."""
        if self.retrieval is not None:
            return self.retrieval.available
        return getattr(self.decoder, "retrieval_available", None)

    def destroy_node(self) -> None:
        """Stop the step thread and the decode worker, then the node and its helper node."""
        self._stopping = True
        self._wake.set()
        self._step_thread.join(timeout=STEP_JOIN_TIMEOUT_S)  # a decode under way finishes
        if isinstance(self.decoder, DecodeWorker):
            self.decoder.close()
        with self._state_lock:
            self._state_node.destroy_node()
        super().destroy_node()

    def _input_topics(self) -> dict[str, str]:
        """Input name -> the topic it comes from (as resolved by remapping)."""
        cfg = self.config
        suffix = "" if cfg.image_transport == "raw" else "/compressed"
        return {"third_person": self.resolve_topic_name(cfg.third_person_topic + suffix),
                "wrist": self.resolve_topic_name(cfg.wrist_topic + suffix),
                "joint_states": self.resolve_topic_name("/joint_states"),
                "ee_pose": self.resolve_topic_name("/ee_pose")}

    def _inputs_text(self) -> str:
        topics = self._input_topics()
        return (f"frames on {topics['third_person']} and {topics['wrist']}, the robot state on "
                f"{topics['joint_states']} and {topics['ee_pose']}, and an instruction "
                f"(parameter `instruction`, service {self.get_fully_qualified_name()}"
                f"/set_instruction, or /heisd/episode_status)")

    def _on_set_parameters(self, params) -> SetParametersResult:
        for param in params:
            if param.name == "instruction":
                self.instruction = str(param.value)
            elif param.name == "task" and str(param.value) != self.task:
                # The task is the episode's (its DB collection): a new one starts an episode.
                self.task = str(param.value)
                self._request_episode(f"task parameter set to {self.task!r}", self.task)
        return SetParametersResult(successful=True)

    def _on_set_instruction(self, request, response):
        if not request.instruction.strip():
            response.success, response.message = False, "instruction: expected non-empty text"
            return response
        self.instruction, self.task = request.instruction, request.task
        self._episode_key = ("set_instruction", request.instruction, request.task)
        self._request_episode("new instruction", request.task)
        response.success = True
        response.message = f"instruction {self.instruction!r}, task {self.task or '(derived)'!r}"
        self.get_logger().info(response.message)
        return response

    # ------------------------------------------------------------------ inputs
    def _on_image(self, camera: str, msg) -> None:
        stamp = stamp_to_seconds(msg.header.stamp)
        try:
            rgb = image_to_rgb(msg) if isinstance(msg, Image) else compressed_to_rgb(msg)
            problem = ""
        except ImageConversionError as exc:
            rgb, problem = None, str(exc)
        now = self._now()
        self._received[camera] = now
        with self._lock:
            self.gate.add_frame(camera, stamp, rgb, problem)
            self.latency.frame_received(stamp, now)
        self._wake.set()

    def _take_robot_state(self) -> None:
        """Take the newest /joint_states and /ee_pose that arrived since the last take.

        The subscriptions keep only the newest message (depth 1); older ones are what the
        robot was, not what it is. With both taken, the robot input is rebuilt once.
        """
        with self._state_lock:
            new = False
            for sub in self._state_subs.values():
                taken = None
                try:
                    with sub.handle:
                        while (msg_info := sub.handle.take_message(sub.msg_type,
                                                                   sub.raw)) is not None:
                            taken = msg_info[0]
                except InvalidHandle:  # destroyed while shutting down
                    return
                if taken is not None:
                    sub.callback(taken)
                    new = True
            if new:
                self._update_robot()

    def _on_joint_state(self, msg: JointState) -> None:
        self._joint = msg
        self._received["joint_states"] = self._now()

    def _on_pose(self, msg: PoseStamped) -> None:
        self._pose = msg
        self._received["ee_pose"] = self._now()

    def _update_robot(self) -> None:
        joint, pose = self._joint, self._pose
        if joint is None or pose is None:
            return
        robot, problem = robot_input(joint, pose)
        if robot is not None and not problem and not robot.problem():
            jump_m = self.config.episode_jump_m
            if self._last_ee_m is not None and jump_m > 0:
                moved_m = float(np.linalg.norm(robot.ee_position_m - self._last_ee_m))
                if moved_m > jump_m:
                    self._request_episode(f"the EE jumped {moved_m:.3f} m between two robot "
                                          f"states (episode_jump_m {jump_m} m)",
                                          since_s=robot.stamp_s)
            self._last_ee_m = np.array(robot.ee_position_m, dtype=np.float64)
        with self._lock:
            self.gate.add_robot(robot, problem)

    def _on_episode(self, msg: EpisodeStatus) -> None:
        if not self.config.follow_episode_status:
            return
        key = (msg.suite, msg.task, msg.episode, msg.seed)
        progress = self._episode_status_progress
        # The same key again from its start (a restarted sim begins at episode 0 again) is a
        # new episode too: its step went back, or it runs again after it was done.
        restarted = key == self._episode_key and progress is not None and (
            msg.step < progress[0] or (progress[1] and not msg.done))
        self._episode_status_progress = (int(msg.step), bool(msg.done))
        if key != self._episode_key or restarted:
            self._episode_key = key
            self._episode_ended = False
            start_s = stamp_to_seconds(msg.header.stamp)
            self._request_episode(f"episode {msg.episode} of {msg.task or msg.suite} "
                                  f"(seed {msg.seed}) {'restarted' if restarted else 'started'}",
                                  msg.task, since_s=start_s if start_s > 0 else None)
        if msg.done and not self._episode_ended and self.decoder is not None:
            self._episode_ended = True
            try:
                self.decoder.episode_end(bool(msg.success))
            except WorkerError as exc:
                self._worker_lost(exc)
        if not self.get_parameter("instruction").value:
            self.instruction, self.task = msg.instruction, msg.task or self.task

    def _request_episode(self, why: str, task: str | None = None,
                         since_s: float | None = None) -> None:
        """Start a new episode before the next step (the step thread applies it).

        ``since_s``: the episode's start stamp; frames stamped from then on count for it
        (:meth:`InputGate.reset`). None: only frames that arrive after the reset.
        """
        self._episode_request = (why, task, since_s)
        self._wake.set()

    def _start_requested_episode(self) -> None:
        request, self._episode_request = self._episode_request, None
        if request is None:
            return
        why, task, since_s = request
        self._episode_ended = False
        self._episode = EpisodeState(task or self.task or None)
        with self._lock:
            self.gate.reset(since_s)
        self._path = Path()
        if self.decoder is not None:
            try:
                self.decoder.begin_episode(task or self.task or None)
            except WorkerError as exc:
                self._worker_lost(exc)
        self.episodes_started += 1
        self.get_logger().info(f"new episode: {why}")

    @property
    def episode(self) -> EpisodeState:
        """The current episode as the robot got it (task, step, gripper state)."""
        return self._episode

    def _now(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    # ------------------------------------------------------------------ the step
    def _step_loop(self) -> None:
        """The step thread: a step run each time new input wakes it, until the node stops."""
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stopping:
                return
            try:
                self._step()
            except Exception as exc:  # noqa: BLE001 - handed to the executor, which raises it
                self._step_failure = exc
                self._failure_gc.trigger()
                return

    def _raise_step_failure(self) -> None:
        if self._step_failure is not None:
            raise self._step_failure

    def _step(self) -> None:
        """Decode steps back to back while new paired frames come, one at a time.

        The next observation is handed to the decoder as soon as a command is out; the
        step's visualisation (HybridStep, path, markers) is published while that next
        observation decodes, so the decoder does not wait for it.
        """
        viz = None
        while self.decoder is not None:
            pending = self._begin_step()
            if viz is not None:
                self._publish_viz(*viz)
                viz = None
            if pending is None:
                return
            try:
                step = self.decoder.result()
            except WorkerError as exc:
                self._worker_lost(exc)
                return
            except (ValueError, RuntimeError) as exc:
                self._refuse("decode failed", f"decode failed: {exc}")
                continue
            viz = self._end_step(pending, step)
        if viz is not None:
            self._publish_viz(*viz)

    def _begin_step(self) -> tuple | None:
        """Take the newest inputs and hand their observation to the decoder; None: no step."""
        if self.decoder is None:
            return None
        self._start_requested_episode()
        now = self._now()
        if now - self._last_step_t < self.config.min_period_s:
            return None
        self._take_robot_state()
        with self._lock:
            result = self.gate.take(now)
        if result.problem:
            self._refuse(result.kind, result.problem)
            return None
        snap = result.snapshot
        if snap is None:
            return None
        if not self.instruction.strip():
            self._refuse("no instruction", "no instruction: set the `instruction` parameter "
                                           "or call ~/set_instruction")
            return None
        robot = snap.robot
        proprio = make_proprio(robot.ee_position_m, robot.ee_rpy_rad, robot.gripper_width_m)
        observation = Observation(
            image_primary=snap.third_person, image_wrist=snap.wrist,
            instruction=self.instruction, proprio=proprio, stamp_s=snap.stamp_s,
            episode=self._episode)
        t0 = time.perf_counter()
        try:
            self.decoder.submit(observation)
        except WorkerError as exc:
            self._worker_lost(exc)
            return None
        return snap, now, t0

    def _end_step(self, pending: tuple, step: DecodedStep) -> tuple | None:
        """Send the step's command unless its frames got too old; the viz to publish, or None."""
        snap, now, t0 = pending
        decode_ms = (time.perf_counter() - t0) * 1e3
        self._last_step_t = now
        self.latency.step_started(snap.stamp_s, now)
        age_s = self._now() - snap.stamp_s
        limit_s = self.config.max_command_age_s
        stale = not age_s <= limit_s  # NaN-safe: an unknown age is too old
        self.latency.decoded(decode_ms, held_stale=stale)
        self._warn_if_too_slow()
        if stale:
            self._refuse("stale command", f"stale command: its frames were {age_s:.3f} s old "
                                          f"when the action was ready (max_command_age_s "
                                          f"{limit_s} s; decode took {decode_ms:.0f} ms); "
                                          f"not sent")
            return None
        return self._publish(step, snap.stamp_s, snap.robot, decode_ms)

    def _worker_lost(self, exc: WorkerError) -> None:
        """The decode worker died: act on nothing more, say why (ERROR in /diagnostics)."""
        worker, self.decoder = self.decoder, None
        if isinstance(worker, DecodeWorker):
            worker.close()  # reaps the process and closes its socket
        self.config_error = f"policy stopped: {exc}; restart the node"
        self.get_logger().error(self.config_error)

    def _warn_if_too_slow(self) -> None:
        """Say once when the measured step time alone exceeds ``max_command_age_s``."""
        if self.too_slow_warning:
            return
        decode_ms = self.latency.decode_p50_ms(min_steps=TOO_SLOW_MIN_STEPS)
        limit_s = self.config.max_command_age_s
        if decode_ms is None or decode_ms <= limit_s * 1e3:
            return
        self.too_slow_warning = (
            f"this machine decodes too slowly for the command-age limit: a step takes "
            f"{decode_ms:.0f} ms (median of the last {TOO_SLOW_MIN_STEPS} or more), more than "
            f"max_command_age_s = {limit_s} s, so most commands will be held as stale. "
            f"Run the VLA on a GPU (model.device), feed smaller camera images, or, if the "
            f"task tolerates older commands, raise max_command_age_s (and the driver's "
            f"controller.max_command_age_s)")
        self.get_logger().warning(self.too_slow_warning)

    def _publish(self, step: DecodedStep, stamp_s: float, robot: RobotInput,
                 decode_ms: float) -> tuple:
        """Send the command now; return what :meth:`_publish_viz` publishes for it."""
        cfg, stamp = self.config, seconds_to_stamp(stamp_s)
        self._cmd_pub.publish(command_msg(step, self._step_index, stamp, cfg.frame_id))
        self._episode = self._episode.executed(step.action)
        self.latency.published(stamp_s, self.get_clock().now().nanoseconds * 1e-9, decode_ms)
        self.commands_sent += 1
        viz = (step, self._step_index, stamp, robot, self.task or self.instruction,
               self.retrieval_available)
        self._step_index += 1
        self.last_problem = ""  # a command went out: nothing holds the robot now
        self._last_activity_t = self._now()
        return viz

    def _publish_viz(self, step: DecodedStep, step_index: int, stamp, robot: RobotInput,
                     task: str, retrieval_available: bool | None) -> None:
        """HybridStep, the executed path and the router markers of a step that was sent."""
        cfg = self.config
        self._step_pub.publish(hybrid_step_msg(step, step_index, stamp, cfg.frame_id, task,
                                               retrieval_available))
        self._path_pub.publish(append_pose(self._path, robot_pose_msg(robot, stamp, cfg.frame_id),
                                           cfg.path_length))
        self._marker_pub.publish(step_markers(step_index, stamp, cfg.frame_id,
                                              robot.ee_position_m, step.source, step.fields,
                                              cfg.marker_keep))

    def _refuse(self, kind: str, problem: str) -> None:
        """Count and (throttled per kind) warn; nothing is sent for this input."""
        self.last_problem = self.last_refusal = problem
        self._last_activity_t = self._now()
        self.refusals[kind] += 1  # last: readers that wait on the count see the reason
        now = time.monotonic()
        if now - self._warned_at.get(kind, -math.inf) >= self.config.warn_throttle_s:
            self._warned_at[kind] = now
            self.get_logger().warning(f"holding, no command: {problem}")

    # ------------------------------------------------------------------ diagnostics
    def latency_summary(self) -> dict[str, float]:
        """Latency of the recent steps in ms, and the ROS share (:meth:`StepLatency.summary`)."""
        return self.latency.summary()

    def diagnostic_status(self) -> DiagnosticStatus:
        """Configuration, refusals by kind, latency."""
        values = {"method": self.config.method, "model": self.model_description,
                  "instruction": self.instruction, "task": self.task,
                  "commands_sent": str(self.commands_sent), "last_problem": self.last_problem,
                  "last_refusal": self.last_refusal,
                  "episodes_started": str(self.episodes_started),
                  "retrieval_available": str(self.retrieval_available),
                  "decoder": getattr(self.decoder, "description", ""),
                  "degraded": getattr(self.decoder, "degraded", ""),
                  "too_slow": self.too_slow_warning}
        values.update({k: f"{v:.3f}" for k, v in self.latency_summary().items()})
        values.update({f"refused[{k}]": str(n) for k, n in sorted(self.refusals.items())})
        # A router method running as drafter SD is a warning until it routes again.
        return policy_status(f"{self.get_name()}: policy", values, self.config_error,
                             self.last_problem or values["degraded"])

    def waiting_for(self, now_s: float | None = None) -> str:
        """What the node waits for when it has done nothing for ``input_timeout_s``, or "".

        Names each input topic that never sent or has been silent for that long, and a
        missing instruction. "" while steps run or refusals already say why.
        """
        cfg = self.config
        now_s = self._now() if now_s is None else now_s
        if self.decoder is None or now_s - self._last_activity_t <= cfg.input_timeout_s:
            return ""
        missing = []
        for name, topic in self._input_topics().items():
            heard = self._received.get(name)
            if heard is None:
                missing.append(f"{topic} (nothing received yet)")
            elif now_s - heard > cfg.input_timeout_s:
                missing.append(f"{topic} (silent for {now_s - heard:.1f} s)")
        if not self.instruction.strip():
            missing.append(f"an instruction (parameter `instruction`, service "
                           f"{self.get_fully_qualified_name()}/set_instruction, or "
                           f"/heisd/episode_status)")
        if not missing:
            return ""
        return "waiting for input: " + "; ".join(missing)

    def _publish_diagnostics(self) -> None:
        self._take_robot_state()  # keeps the robot state's last-heard time current
        waiting = self.waiting_for()
        if waiting:
            self._refuse("waiting for input", waiting)
        msg = DiagnosticArray(status=[self.diagnostic_status()])
        msg.header.stamp = self.get_clock().now().to_msg()
        self._diag_pub.publish(msg)


def main(args: list[str] | None = None) -> None:
    """Run the node until Ctrl-C, SIGTERM or ROS shutdown."""
    from heisd_ros.nodes._spin import spin_node

    # One executor thread: every callback is quick (steps run in the node's own thread).
    spin_node(PolicyNode, args, num_threads=1)


if __name__ == "__main__":
    main()
