"""The PIPER driver node's output on the CAN bus, read as raw frames by a listener of our own.

The node runs in this process (private contexts) with ``emulate:=true`` on a fresh virtual
channel; EE delta commands reach it over real DDS from a second context (a second DDS
participant). A plain python-can bus on the same virtual channel records every frame, and this
file decodes them from bytes itself: neither piper_sdk's parser nor the emulator's decoding (nor
``heisd_ros.robot.piper_can``) is involved, so an encoding error on both sides cannot cancel out.
The arm is only there to answer; what is checked is what the driver *sent*.

The byte layout was learned from piper_sdk 0.6.2 (in the venv):
``piper_msgs/msg_v2/can_id.py`` (ids), ``protocol/protocol_v2/piper_protocol_v2.py``
(``EncodeMessage`` for 0x151-0x154 and 0x159, ``DecodeMessage`` for the 0x2A2-0x2A4 feedback),
``protocol/piper_protocol_base.py`` (``ConvertToList_32bit``/``_16bit``: big-endian, signed
unless told otherwise) and ``interface/piper_interface_v2.py`` (``MotionCtrl_2`` defaults).
"""

from __future__ import annotations

import math
import os
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import can
import numpy as np
import pytest

from test.ros_env import require_ros

rclpy, hmsg, hsrv = require_ros()

from rclpy.executors import MultiThreadedExecutor  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402

from heisd_ros.nodes.piper_driver_node import PiperDriverNode  # noqa: E402
from heisd_ros.nodes.robot_msgs import ee_command_to_msg  # noqa: E402
from heisd_ros.robot.base import EECommand, GripperState  # noqa: E402
from heisd_ros.robot.dry_run import unique_channel  # noqa: E402
from heisd_ros.testing.domains import reserved_domain  # noqa: E402
from test.polling import wait_until  # noqa: E402

# piper_sdk 0.6.2 still passes python-can's deprecated `bustype`.
pytestmark = pytest.mark.filterwarnings(
    "ignore:The 'bustype' argument is deprecated:DeprecationWarning"
)

# --- the wire, as piper_sdk writes it ---------------------------------------------------------
MOTION_CTRL_2 = 0x151  # u8 ctrl_mode, u8 move_mode, u8 speed %, u8 mit_mode, u8 residence_time,
#                        u8 installation_pos, 2 pad bytes
END_POSE_CTRL = (0x152, 0x153, 0x154)  # (i32 X, i32 Y), (i32 Z, i32 RX), (i32 RY, i32 RZ)
GRIPPER_CTRL = 0x159  # i32 stroke (0.001 mm), u16 effort (0.001 N*m), u8 code, u8 set_zero
MOTOR_ENABLE = 0x471
END_POSE_FEEDBACK = (0x2A2, 0x2A3, 0x2A4)  # the same pairs, arm -> host
CTRL_MODE_CAN, MOVE_P, GRIPPER_ENABLE = 0x01, 0x00, 0x01
UNITS_PER_M = 1_000_000  # positions and the gripper stroke: 0.001 mm
UNITS_PER_RAD = 180_000 / math.pi  # angles: 0.001 deg
FULL_TURN = 360_000

# --- the test's settings ------------------------------------------------------------------------
JOINTS = (0.0, 1.1, -1.2, 0.0, 0.5, 0.0)  # flange at about (0.235, 0, 0.432) m, rpy (pi, 1.26, pi)
WORKSPACE_MIN = (0.0, -0.35, 0.10)
WORKSPACE_MAX = (0.5, 0.35, 0.46)  # the lid 3 cm above the start
MAX_STEP_M, MAX_STEP_RAD = 0.02, 0.15
SPEED_PERCENT, EFFORT_NM = 50, 1.0
OPEN_M, CLOSED_M = 0.07, 0.0
TIMEOUT_S = 20.0
OPEN, CLOSED = GripperState.OPEN, GripperState.CLOSED


@dataclass(frozen=True)
class PoseFrame:
    """One EE target as sent: 0x151 + 0x152..0x154, in wire units."""

    position: tuple[int, int, int]  # X, Y, Z in 0.001 mm
    rpy: tuple[int, int, int]  # RX, RY, RZ in 0.001 deg


@dataclass(frozen=True)
class GripperFrame:
    """One 0x159 frame, decoded."""

    stroke: int  # 0.001 mm
    effort: int  # 0.001 N*m
    code: int
    set_zero: int


class CanTap(can.Listener):
    """Keeps every host -> arm frame, and the newest end-pose feedback frames."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._commands: list[can.Message] = []
        self._feedback: dict[int, bytes] = {}

    def on_message_received(self, msg: can.Message) -> None:
        with self._lock:
            if msg.arbitration_id < 0x200 or msg.arbitration_id == MOTOR_ENABLE:
                self._commands.append(msg)
            elif msg.arbitration_id in END_POSE_FEEDBACK:
                self._feedback[msg.arbitration_id] = bytes(msg.data)

    def commands(self, start: int = 0) -> list[can.Message]:
        with self._lock:
            return self._commands[start:]

    def count(self) -> int:
        with self._lock:
            return len(self._commands)

    def count_id(self, can_id: int) -> int:
        """Host -> arm frames with ``can_id`` received so far."""
        with self._lock:
            return sum(m.arbitration_id == can_id for m in self._commands)

    def feedback_pose(self) -> PoseFrame | None:
        """The arm's reported end pose (0x2A2-0x2A4), or None before all three arrived."""
        with self._lock:
            if len(self._feedback) < 3:
                return None
            (x, y), (z, rx), (ry, rz) = (
                struct.unpack(">ii", self._feedback[i]) for i in END_POSE_FEEDBACK
            )
        return PoseFrame((x, y, z), (rx, ry, rz))


def decode(frames: list[can.Message], partial: bool = False) -> list[PoseFrame | GripperFrame]:
    """Host -> arm frames to events; a pose must come as exactly 0x151, 0x152, 0x153, 0x154.

    ``partial``: the last pose may still be on its way (stop before it instead of failing).
    """
    events: list[PoseFrame | GripperFrame] = []
    i = 0
    while i < len(frames):
        if partial and i + 4 > len(frames):
            break
        msg = frames[i]
        assert not msg.is_extended_id and msg.dlc == 8 and len(msg.data) == 8, msg
        data = bytes(msg.data)
        if msg.arbitration_id == GRIPPER_CTRL:
            events.append(GripperFrame(*struct.unpack(">iHBB", data)))
            i += 1
            continue
        assert msg.arbitration_id == MOTION_CTRL_2, f"unexpected frame {msg}"
        ctrl, move, speed, mit, residence, install, pad = struct.unpack(">BBBBBBH", data)
        assert (ctrl, move, speed, mit, residence, install, pad) == (
            CTRL_MODE_CAN, MOVE_P, SPEED_PERCENT, 0, 0, 0, 0), data.hex()
        group = frames[i + 1 : i + 4]
        assert [m.arbitration_id for m in group] == list(END_POSE_CTRL), (
            f"MotionCtrl_2 not followed by EndPoseCtrl: {[hex(m.arbitration_id) for m in group]}")
        (x, y), (z, rx), (ry, rz) = (struct.unpack(">ii", bytes(m.data)) for m in group)
        events.append(PoseFrame((x, y, z), (rx, ry, rz)))
        i += 4
    return events


def without_resends(events: list) -> list:
    """Drop a pose equal to the previous pose: holds re-send the last target every tick."""
    out, last_pose = [], None
    for event in events:
        if isinstance(event, PoseFrame):
            if event == last_pose:
                continue
            last_pose = event
        out.append(event)
    return out


def angle_units(a: int, b: int) -> int:
    """The angle a - b in 0.001 deg, wrapped into [-180, 180) deg (the arm wraps its angles)."""
    return (a - b + FULL_TURN // 2) % FULL_TURN - FULL_TURN // 2


class Reference:
    """Our own model of the expected target: start pose + step-limited, box-clamped deltas."""

    def __init__(self, start: PoseFrame) -> None:
        self.position_m = np.array(start.position, dtype=np.float64) / UNITS_PER_M
        self.rpy_units = np.array(start.rpy, dtype=np.float64)

    def add(self, dp: tuple[float, float, float], dyaw_rad: float = 0.0) -> PoseFrame:
        step = np.asarray(dp, dtype=np.float64)
        norm = float(np.linalg.norm(step))
        if norm > MAX_STEP_M:
            step *= MAX_STEP_M / norm
        self.position_m = np.clip(self.position_m + step, WORKSPACE_MIN, WORKSPACE_MAX)
        # A yaw delta turns about the fixed z axis: Rz(d) @ Rz(y) Ry(p) Rx(r) only adds d to y.
        self.rpy_units[2] += float(np.clip(dyaw_rad, -MAX_STEP_RAD, MAX_STEP_RAD)) * UNITS_PER_RAD
        return self.frame()

    def frame(self) -> PoseFrame:
        return PoseFrame(
            tuple(int(round(v * UNITS_PER_M)) for v in self.position_m),
            tuple(int(round(v)) for v in self.rpy_units),
        )


def assert_pose_close(got: PoseFrame, want: PoseFrame, what: str) -> None:
    """Equal to the unit, +-1 for float rounding on either side."""
    errors = [g - w for g, w in zip(got.position, want.position, strict=True)]
    errors += [angle_units(g, w) for g, w in zip(got.rpy, want.rpy, strict=True)]
    assert max(abs(e) for e in errors) <= 1, (what, got, want)


#: The rig's parameters (the raw frame test's limits; each test may override some).
RIG_PARAMS = {
    "emulate": True,
    "interface": "virtual",
    "enable_on_start": True,
    "safety.workspace_min_m": list(WORKSPACE_MIN),
    "safety.workspace_max_m": list(WORKSPACE_MAX),
    "safety.max_step_translation_m": MAX_STEP_M,
    "safety.max_step_rotation_rad": MAX_STEP_RAD,
    "piper.speed_percent": SPEED_PERCENT,
    "piper.gripper_effort_nm": EFFORT_NM,
    "piper.stale_feedback_s": 1.0,  # a loaded 2-core box can starve the threads briefly
    "gripper.open_width_m": OPEN_M,
    "gripper.closed_width_m": CLOSED_M,
    # Commands are paced by the driver's processing, not by the arm's motion.
    "controller.max_tracking_error_m": 0.0,
    # The age rule has its own test (test_driver_command_stream): a loaded machine that is
    # slow to hand a command over must not turn the other tests' commands stale.
    "controller.max_command_age_s": 30.0,
    "emulator.initial_joints_rad": list(JOINTS),
    "emulator.initial_gripper_width_m": OPEN_M,
    "emulator.gripper_speed_m_s": 0.2,
}


@dataclass
class Rig:
    """The driver node in this process, a peer publishing its commands, a CAN tap."""

    node: PiperDriverNode
    pub: object  # rclpy Publisher of EECommand on the node's command topic
    tap: CanTap
    channel: str
    peer: object  # the peer's rclpy Node (its clock stamps the commands)

    def now_s(self) -> float:
        """Now on the ROS clock (the driver measures command ages on the same one)."""
        return self.peer.get_clock().now().nanoseconds * 1e-9


def wait_for_callbacks(executor: MultiThreadedExecutor) -> None:
    """Until every callback the executor handed to its thread pool has ended.

    rclpy's MultiThreadedExecutor.shutdown() destroys its guard condition before it joins the
    pool, and a callback ending after that prints "exception was never retrieved". It keeps
    the callbacks it handed out in ``_futures`` (there is no public accessor).
    """
    assert wait_until(lambda: all(task.done() for task in list(executor._futures)))


@contextmanager
def driver_rig(tag: str, **overrides) -> Iterator[Rig]:
    """Driver node + emulated arm (one context), a commanding peer (another), a CAN tap.

    ``overrides`` replace :data:`RIG_PARAMS` entries (dots as in the YAML: pass a dict). The
    rig has a DDS domain of its own, released once everything on it is shut down.
    """
    with reserved_domain() as domain, _rig_on_domain(domain, tag, **overrides) as rig:
        yield rig


@contextmanager
def _rig_on_domain(domain: int, tag: str, **overrides) -> Iterator[Rig]:
    """:func:`driver_rig` on DDS domain ``domain``."""
    channel = unique_channel(f"driver-{tag}")
    prefix = f"/{tag.replace('-', '_')}{os.getpid()}"  # private topics: no other test's commands
    tap = CanTap()
    bus = can.Bus(interface="virtual", channel=channel)
    notifier = can.Notifier(bus, [tap], timeout=0.05)

    node_ctx, peer_ctx = rclpy.Context(), rclpy.Context()
    rclpy.init(context=node_ctx, domain_id=domain)
    rclpy.init(context=peer_ctx, domain_id=domain)
    # The peer is the driver's commander: the only node whose commands it executes.
    params = {**RIG_PARAMS, "can_channel": channel,
              "commander.node_name": f"/{tag.replace('-', '_')}_commander", **overrides}
    topics = ("/heisd/ee_command", "/joint_states", "/ee_pose", "/diagnostics")
    node = PiperDriverNode(
        f"{tag.replace('-', '_')}_piper_driver",
        context=node_ctx,
        parameter_overrides=[Parameter(k, value=v) for k, v in params.items()],
        cli_args=["--ros-args", *(a for t in topics for a in ("-r", f"{t}:={prefix}{t}"))],
    )
    # Two threads, as in the node's process (control beside feedback). Spun in steps until
    # `stop`: Executor.shutdown() from another thread does not wait for a running spin().
    executor = MultiThreadedExecutor(num_threads=2, context=node_ctx)
    executor.add_node(node)
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            executor.spin_once(timeout_sec=0.05)

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    peer = rclpy.create_node(f"{tag.replace('-', '_')}_commander", context=peer_ctx)
    pub = peer.create_publisher(hmsg.EECommand, f"{prefix}/heisd/ee_command", 10)
    try:
        yield Rig(node, pub, tap, channel, peer)
    finally:
        stop.set()
        spinner.join(timeout=10)
        wait_for_callbacks(executor)
        executor.shutdown()
        node.destroy_node()
        peer.destroy_node()
        rclpy.shutdown(context=peer_ctx)
        rclpy.shutdown(context=node_ctx)
        notifier.stop()
        bus.shutdown()


@pytest.fixture
def rig():
    # Speed limits off: each command's target goes out whole (their own test is in
    # test_driver_command_stream.py).
    with driver_rig(
        "raw-can", **{"safety.max_linear_speed_m_s": 0.0, "safety.max_angular_speed_rad_s": 0.0}
    ) as rig:
        yield rig.node, rig.pub, rig.tap, rig


def wait_for(predicate: Callable[[], bool], timeout_s: float = TIMEOUT_S) -> bool:
    return wait_until(predicate, timeout_s)


def controller_values(node: PiperDriverNode) -> dict[str, str]:
    return {kv.key: kv.value for kv in node.controller_diagnostic().values}


def handled(node: PiperDriverNode) -> int:
    """Commands the driver finished with: executed, refused or (arm) waited."""
    values = controller_values(node)
    return sum(int(values[f"commands_{k}"]) for k in ("executed", "rejected", "waited"))


def enabling_over(node: PiperDriverNode, tap: CanTap) -> bool:
    """The controller started (after enabling) and the tap holds every frame enabling sent."""
    if controller_values(node)["status"] not in ("running", "watchdog_hold"):
        return False
    handled = node.emulator.state().frames_received
    return all(tap.count_id(i) == handled.get(i, 0) for i in (MOTOR_ENABLE, GRIPPER_CTRL))


def test_driver_sends_clamped_absolute_targets_and_gripper_frames_only_on_change(rig):
    node, pub, tap, stamps = rig
    assert wait_for(lambda: pub.get_subscription_count() > 0), "the node never subscribed"
    # Started (watchdog_hold: no command for a second yet, the arm rests where it is), and
    # enabling (0x471 and 0x159 frames) is over: record from here.
    assert wait_for(lambda: enabling_over(node, tap)), (
        node.arm_diagnostic().message, node.controller_diagnostic().message)
    mark = tap.count()
    start = tap.feedback_pose()
    assert start is not None, "no end-pose feedback on the bus"
    assert abs(start.position[2] - 432_466) < 2_000, start  # FK of JOINTS, 0.001 mm

    reference = Reference(start)
    expected: list[PoseFrame | GripperFrame] = []
    steps = 0

    def send(dp=(0.0, 0.0, 0.0), dyaw=0.0, gripper=OPEN, from_target=False) -> None:
        nonlocal steps
        steps += 1
        pub.publish(ee_command_to_msg(EECommand(
            dp, (0.0, 0.0, dyaw), gripper=gripper, gripper_from_target=from_target,
            step_index=steps, frame_id="base_link", stamp_s=stamps.now_s())))
        assert wait_for(lambda: handled(node) == steps), (steps, controller_values(node))

    def move(dp=(0.0, 0.0, 0.0), dyaw=0.0, **gripper) -> None:
        expected.append(reference.add(dp, dyaw))
        send(dp, dyaw, **gripper)

    def grip(state: GripperState, width_m: float) -> None:
        # The change itself: the arm part is dropped, the last target is re-sent with 0x159.
        send((0.01, 0.0, 0.0), gripper=state, from_target=True)
        expected.append(GripperFrame(int(round(width_m * UNITS_PER_M)),
                                     int(round(EFFORT_NM * 1000)), GRIPPER_ENABLE, 0))
        assert wait_for(lambda: controller_values(node)["gripper_phase"] == "idle"
                        and controller_values(node)["status"] != "gripper_wait")

    move((0.01, 0.0, -0.005))  # a plain delta
    move((0.5, 0.0, 0.0))  # 25x the step limit: +2 cm in x
    move((0.03, 0.04, 0.0))  # 5 cm diagonal: scaled to 2 cm, direction kept
    move(dyaw=0.5)  # 0.5 rad: turned by 0.15 rad about the base z axis
    for _ in range(3):  # climb 2 cm per step into the lid at z = 0.46 m
        move((0.0, 0.0, 0.02))
    # Gripper: ignored when not from the target VLA, asked once (hysteresis 1 of 2), then sent.
    move((0.0, 0.0, -0.01), gripper=CLOSED)
    move((0.0, 0.0, -0.01), gripper=CLOSED, from_target=True)
    grip(CLOSED, CLOSED_M)
    move((0.0, -0.01, 0.0), gripper=CLOSED, from_target=True)  # no change: no 0x159
    move((0.0, 0.01, 0.0), gripper=OPEN)  # not from the target: no 0x159
    move((0.0, 0.01, 0.0), gripper=OPEN, from_target=True)  # 1 of 2
    grip(OPEN, OPEN_M)
    move((-0.01, 0.0, 0.0), gripper=OPEN, from_target=True)

    # Holds re-send the last target (at the lid too): compare distinct consecutive targets.
    expected = without_resends(expected)
    # The listener may trail the sender by a few frames.
    assert wait_for(
        lambda: len(without_resends(decode(tap.commands(mark), partial=True))) >= len(expected))
    frames = tap.commands(mark)
    assert MOTOR_ENABLE not in {m.arbitration_id for m in frames}
    got = without_resends(decode(frames))
    kinds = [type(e).__name__ for e in got]
    assert kinds == [type(e).__name__ for e in expected], kinds

    poses = [e for e in got if isinstance(e, PoseFrame)]
    for i, (have, want) in enumerate(zip(got, expected, strict=True)):
        if isinstance(want, GripperFrame):
            assert have == want, (i, have, want)
        else:
            assert_pose_close(have, want, f"event {i}")
    # The limits hold in wire units between consecutive targets and against the box.
    lo = [int(round(v * UNITS_PER_M)) for v in WORKSPACE_MIN]
    hi = [int(round(v * UNITS_PER_M)) for v in WORKSPACE_MAX]
    step_units, turn_units = MAX_STEP_M * UNITS_PER_M, MAX_STEP_RAD * UNITS_PER_RAD
    previous = start
    for pose in poses:
        assert all(a <= v <= b for a, v, b in zip(lo, pose.position, hi, strict=True)), pose
        moved = np.subtract(pose.position, previous.position)
        assert float(np.linalg.norm(moved)) <= step_units + 2, (previous, pose)
        turned = [angle_units(a, b) for a, b in zip(pose.rpy, previous.rpy, strict=True)]
        assert max(abs(t) for t in turned) <= turn_units + 1, (previous, pose)
        previous = pose
    # Spot checks in raw numbers: the clamped x step, the scaled diagonal, the turn, the lid.
    assert poses[1].position[0] - poses[0].position[0] == pytest.approx(20_000, abs=1)
    assert np.subtract(poses[2].position, poses[1].position)[:2] == pytest.approx(
        [12_000, 16_000], abs=1)
    assert angle_units(poses[3].rpy[2], poses[2].rpy[2]) == pytest.approx(
        0.15 * UNITS_PER_RAD, abs=1)
    assert max(p.position[2] for p in poses) == 460_000
    assert sum(isinstance(e, GripperFrame) for e in got) == 2
