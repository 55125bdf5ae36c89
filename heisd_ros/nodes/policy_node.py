r"""The policy node: camera frames + robot state in, one EE command per decoded action out.

A thin adapter over modules of :mod:`heisd_ros.nodes`: ``policy_subscriptions`` converts what
comes in, the input gate (``policy_inputs``) pairs frames and refuses bad input, the episode
tracker (``policy_episode``) starts episodes, the step loop (``policy_step_loop``) runs the
decoder of the configured ``method`` (``policy_decoders``) and holds stale commands
(``policy_staleness``), and ``policy_outputs`` publishes. Settings: ``policy_config``.

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

Models load at start. A bad path or model, or an OpenVLA target on a CPU without
``model.allow_cpu`` (``heisd_ros.models.loading``), does not kill the node: it stays up,
publishes nothing but diagnostics, and logs and reports the reason. Every hold (refused input,
a stale command, silent inputs) gets one throttled warning per kind, named by its rule, and no
command; /diagnostics shows the live problem (WARN) until the next command is sent. A new
episode resets the per-episode state (router history, drafts, gripper state, path).
"""

from __future__ import annotations

import threading
from dataclasses import asdict
from operator import attrgetter

import numpy as np
from diagnostic_msgs.msg import DiagnosticStatus
from rcl_interfaces.msg import ParameterDescriptor, SetParametersResult
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.node import Node

from heisd_ros.msg import EpisodeStatus
from heisd_ros.nodes._params import dataclass_from_parameters
from heisd_ros.nodes.decode_worker import DecodeWorker, WorkerError, WorkerSpec
from heisd_ros.nodes.policy_config import PolicyNodeConfig
from heisd_ros.nodes.policy_decoders import (
    DecodedStep,
    ModelConfig,
    build_decoder,
    load_target,
    warm_up,
)
from heisd_ros.nodes.policy_diagnostics import StepLatency, policy_status
from heisd_ros.nodes.policy_episode import EpisodeProgress, EpisodeTracker
from heisd_ros.nodes.policy_inputs import InputGate, InputGateConfig, RobotInput, Snapshot
from heisd_ros.nodes.policy_outputs import PolicyOutputs
from heisd_ros.nodes.policy_staleness import HoldPolicy
from heisd_ros.nodes.policy_step_loop import StepLoop
from heisd_ros.nodes.policy_subscriptions import RobotStateTaker, camera_topics, subscribe_cameras
from heisd_ros.nodes.qos import STATUS_QOS
from heisd_ros.nodes.retrieval_client import RetrievalServiceClient
from heisd_ros.nodes.robot_msgs import stamp_to_seconds
from heisd_ros.srv import SetInstruction

__all__ = ["PolicyNode", "main"]


class PolicyNode(Node):
    """Runs the VLA decoder on paired camera frames; one EE command per step."""

    def __init__(self, node_name: str = "policy_node", **kwargs) -> None:
        """Declare parameters, subscribe, then configure (load the models).

        ``node_name`` is remappable with ``__node:=``; ``kwargs`` go to
        :class:`rclpy.node.Node` (``context``, ``parameter_overrides``, ...).
        """
        super().__init__(node_name, **kwargs)
        writable = ParameterDescriptor(read_only=False)
        instruction = str(self.declare_parameter("instruction", "", writable).value)
        task = str(self.declare_parameter("task", "", writable).value)
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
        cfg = self.config
        self.gate = InputGate(gate_config)
        self.model_description = ""
        self.latency = StepLatency(cfg.latency_window)
        self.holds = HoldPolicy(cfg, self._now, self.get_logger().warning)
        self.refusals = self.holds.refusals
        self.episodes = EpisodeTracker(instruction, task, cfg.episode_jump_m,
                                       on_request=lambda: self.steps.wake())
        self.add_on_set_parameters_callback(self._on_set_parameters)
        self._lock = threading.Lock()  # gate + robot state between input and step callbacks
        self.outputs = PolicyOutputs(self, cfg)
        # Taken by each step and diagnostics tick, not spun (policy_subscriptions says why).
        self.robot_state = RobotStateTaker(self, self._on_robot_state,
                                           lambda name: self.holds.heard(name, self._now()))
        # Steps run in a thread of their own (policy_step_loop); the executor has only quick
        # callbacks left (see main()). A failed step is re-raised in the executor, which then
        # stops the process as it would for any failed callback.
        self._failure_gc = self.create_guard_condition(lambda: self.steps.raise_failure())
        self.steps = StepLoop(cfg, self.gate, self.episodes, self.holds, self.latency,
                              clock=self._now, publish=self._publish,
                              take_robot_state=self.robot_state.take,
                              worker_lost=self._worker_lost,
                              episode_started=self._episode_started,
                              failed=self._failure_gc.trigger, gate_lock=self._lock)
        self._input_group = MutuallyExclusiveCallbackGroup()
        self._client_group = MutuallyExclusiveCallbackGroup()
        subscribe_cameras(self, cfg, self._on_frame, self._input_group)
        self.create_subscription(EpisodeStatus, "/heisd/episode_status", self._on_episode,
                                 STATUS_QOS, callback_group=self._input_group)
        self.create_service(SetInstruction, "~/set_instruction", self._on_set_instruction,
                            callback_group=self._input_group)
        self.create_timer(cfg.diagnostics_period_s, self._publish_diagnostics,
                          callback_group=self._input_group)
        # With a decode worker the worker holds the retrieval client (its own small node).
        self.retrieval = None if cfg.decode_worker else RetrievalServiceClient(
            self, cfg.retrieval_service, callback_group=self._client_group)
        if not self.config_error:
            self.configure()
        if self.config_error:
            self.get_logger().error(self.config_error)
        self.steps.start()

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
        self.config_error = ""
        self.get_logger().info(f"policy configured: method {self.config.method!r}, target "
                               f"{self.model_description}; decoder {self.decoder.description}")
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
        return self.decoder.retrieval_available if self.decoder is not None else None

    def destroy_node(self) -> None:
        """Stop the step thread and the decode worker, then the node and its helper node."""
        self.steps.stop()  # a decode under way finishes
        if isinstance(self.decoder, DecodeWorker):
            self.decoder.close()
        self.robot_state.destroy()
        super().destroy_node()

    def _input_topics(self) -> dict[str, str]:
        """Input name -> the topic it comes from (as resolved by remapping)."""
        topics = {**camera_topics(self.config), "joint_states": "/joint_states",
                  "ee_pose": "/ee_pose"}
        return {name: self.resolve_topic_name(topic) for name, topic in topics.items()}

    def _inputs_text(self) -> str:
        topics = self._input_topics()
        return (f"frames on {topics['third_person']} and {topics['wrist']}, the robot state on "
                f"{topics['joint_states']} and {topics['ee_pose']}, and an instruction "
                f"(parameter `instruction`, service {self.get_fully_qualified_name()}"
                f"/set_instruction, or /heisd/episode_status)")

    def _on_set_parameters(self, params) -> SetParametersResult:
        for param in params:
            if param.name == "instruction":
                self.episodes.instruction = str(param.value)
            elif param.name == "task":
                self.episodes.set_task(str(param.value))
        return SetParametersResult(successful=True)

    def _on_set_instruction(self, request, response):
        if not request.instruction.strip():
            response.success, response.message = False, "instruction: expected non-empty text"
            return response
        self.episodes.set_instruction(request.instruction, request.task)
        response.success = True
        response.message = f"instruction {self.instruction!r}, task {self.task or '(derived)'!r}"
        self.get_logger().info(response.message)
        return response

    def _on_frame(self, camera: str, stamp: float, rgb: np.ndarray | None, problem: str) -> None:
        now = self._now()
        self.holds.heard(camera, now)
        with self._lock:
            self.gate.add_frame(camera, stamp, rgb, problem)
            self.latency.frame_received(stamp, now)
        self.steps.wake()

    def _on_robot_state(self, robot: RobotInput | None, problem: str) -> None:
        self.episodes.robot_state(robot, problem)
        with self._lock:
            self.gate.add_robot(robot, problem)

    def _on_episode(self, msg: EpisodeStatus) -> None:
        if not self.config.follow_episode_status:
            return
        self.episodes.status(EpisodeProgress(msg.suite, msg.task, msg.episode, msg.seed, msg.step,
                                             msg.done, stamp_to_seconds(msg.header.stamp)))
        if msg.done and self.decoder is not None and self.episodes.end():
            try:
                self.decoder.episode_end(bool(msg.success))
            except WorkerError as exc:
                self._worker_lost(exc)
        if not self.get_parameter("instruction").value:
            self.episodes.follow(msg.instruction, msg.task)

    def _episode_started(self, why: str) -> None:
        """Called by the step loop once a new episode has started (in the step thread)."""
        self.outputs.new_episode()
        self.get_logger().info(f"new episode: {why}")

    @property
    def decoder(self):
        """The decoder in use, or None (not configured, or the decode worker died)."""
        return self.steps.decoder

    @decoder.setter
    def decoder(self, decoder) -> None:
        self.steps.decoder = decoder

    # What tests and /diagnostics read of the node, kept by the parts that own it.
    episode = property(attrgetter("episodes.state"), doc="The episode as the robot got it.")
    instruction = property(attrgetter("episodes.instruction"), doc="The instruction acted on.")
    task = property(attrgetter("episodes.task"), doc="The task; '': derived from the instruction.")
    episodes_started = property(attrgetter("episodes.started"), doc="Episodes started so far.")
    commands_sent = property(attrgetter("steps.commands_sent"), doc="Commands published so far.")
    last_problem = property(attrgetter("holds.last_problem"), doc="Why the node holds now.")
    too_slow_warning = property(attrgetter("holds.too_slow_warning"), doc="Decoding too slow.")

    def _now(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    def _publish(self, step: DecodedStep, step_index: int, snap: Snapshot):
        """Send the step's command now; return what publishes its status and viz later."""
        return self.outputs.command(step, step_index, snap, self.task or self.instruction,
                                    self.retrieval_available)

    def _worker_lost(self, exc: WorkerError) -> None:
        """The decode worker died: act on nothing more, say why (ERROR in /diagnostics)."""
        worker, self.decoder = self.decoder, None
        if isinstance(worker, DecodeWorker):
            worker.close()  # reaps the process and closes its socket
        self.config_error = f"policy stopped: {exc}; restart the node"
        self.get_logger().error(self.config_error)

    def diagnostic_status(self) -> DiagnosticStatus:
        """Configuration, refusals by kind, latency."""
        values = {"method": self.config.method, "model": self.model_description,
                  "instruction": self.instruction, "task": self.task,
                  "commands_sent": str(self.commands_sent), "last_problem": self.last_problem,
                  "last_refusal": self.holds.last_refusal,
                  "episodes_started": str(self.episodes_started),
                  "retrieval_available": str(self.retrieval_available),
                  "decoder": self.decoder.description if self.decoder is not None else "",
                  "degraded": self.decoder.degraded if self.decoder is not None else "",
                  "too_slow": self.too_slow_warning}
        values.update({k: f"{v:.3f}" for k, v in self.latency.summary().items()})
        values.update({f"refused[{k}]": str(n) for k, n in sorted(self.refusals.items())})
        # A router method running as drafter SD is a warning until it routes again.
        return policy_status(f"{self.get_name()}: policy", values, self.config_error,
                             self.last_problem or values["degraded"])

    def waiting_for(self, now_s: float | None = None) -> str:
        """What the node waits for when idle for ``input_timeout_s``, or "" (``HoldPolicy``)."""
        if self.decoder is None:
            return ""
        instruction = "" if self.instruction.strip() else (
            f"an instruction (parameter `instruction`, service "
            f"{self.get_fully_qualified_name()}/set_instruction, or /heisd/episode_status)")
        return self.holds.waiting_for(self._now() if now_s is None else now_s,
                                      self._input_topics(), instruction)

    def _publish_diagnostics(self) -> None:
        self.robot_state.take()  # keeps the robot state's last-heard time current
        waiting = self.waiting_for()
        if waiting:
            self.holds.refuse("waiting for input", waiting)
        self.outputs.diagnostics(self.diagnostic_status())


def main(args: list[str] | None = None) -> None:
    """Run the node until Ctrl-C, SIGTERM or ROS shutdown."""
    from heisd_ros.nodes._spin import spin_node

    # One executor thread: every callback is quick (steps run in the node's own thread).
    spin_node(PolicyNode, args, num_threads=1)


if __name__ == "__main__":
    main()
