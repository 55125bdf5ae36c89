"""The PIPER driver node in its own process, driven over real DDS from this test process.

The node runs from the installed wrapper ``nodes/piper_driver_node`` with the shipped
``config/piper_driver_node.yaml`` plus test overrides and ``emulate:=true``: the real
piper_sdk inside the node talks to an emulated PIPER on python-can's virtual bus in the same
process. What the arm *is* comes back on the node's ``emulated arm`` diagnostics; what it
*reports* on /joint_states and /ee_pose. Tests share one node process and start from
``Driver.ready()`` (faults cleared, motors enabled, controller running). Commands are stamped
on the ROS clock, as the policy node stamps them (the observation time). Tests wait on
conditions (diagnostics, poses, counters), never for a fixed time: "nothing happened" is
checked once the driver has reported handling what came before.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from test.ros_env import require_ros

rclpy, hmsg, hsrv = require_ros()

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus  # noqa: E402
from geometry_msgs.msg import PoseStamped  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from sensor_msgs.msg import JointState  # noqa: E402
from std_srvs.srv import SetBool, Trigger  # noqa: E402

from heisd_ros.geometry.rotations import (  # noqa: E402
    quat_xyzw_to_matrix,
    rotation_angle,
    rpy_to_matrix,
)
from heisd_ros.nodes.robot_msgs import ee_command_to_msg  # noqa: E402
from heisd_ros.robot.base import CommandSource, EECommand, GripperState  # noqa: E402
from heisd_ros.robot.piper_kinematics import PiperKinematics  # noqa: E402
from test.node_process import NodeProcess, write_params  # noqa: E402
from test.polling import spin_for, spin_until  # noqa: E402

EECommandMsg = hmsg.EECommand
REPO = Path(__file__).resolve().parents[1]
NODE_PROGRAM = REPO / "nodes" / "piper_driver_node"
NAME = "piper_driver_node"
JOINTS = (0.0, 1.1, -1.2, 0.0, 0.5, 0.0)  # flange at about (0.235, 0, 0.432) m
Z_MAX = 0.46  # workspace lid, 3 cm above the start
TIMEOUT_S = 20.0
# Wire resolution: 0.001 mm for positions and the gripper, 0.001 deg for angles.
POS_TOL_M, ANGLE_TOL_RAD = 3e-6, 1e-4
OPEN, CLOSED = GripperState.OPEN, GripperState.CLOSED


class DriverProcess(NodeProcess):
    """The driver program in a subprocess with the shipped YAML plus ``overrides``."""

    def __init__(self, tmp: Path, domain: int, overrides: dict, name: str = NAME,
                 prefix: str = "") -> None:
        # This process's client node (Driver) is the driver's commander.
        overrides = {"commander.node_name": f"/{name}_test_client", **overrides}
        params = write_params(tmp / "params.yaml", NAME, overrides)
        self.name, self.prefix = name, prefix
        remaps = [f"{t}:={prefix}{t}" for t in ("/joint_states", "/ee_pose", "/heisd/ee_command")]
        super().__init__([str(NODE_PROGRAM), "--ros-args", "--params-file", str(params),
                          "-r", f"__node:={name}", *(a for r in remaps for a in ("-r", r))],
                         tmp, domain)


class Driver:
    """This process's view of the node: its topics, services and diagnostics."""

    def __init__(self, context, proc: DriverProcess) -> None:
        self.proc = proc
        self.name = proc.name
        self.node = rclpy.create_node(f"{proc.name}_test_client", context=context)
        self.executor = SingleThreadedExecutor(context=context)
        self.executor.add_node(self.node)
        self.joint_states: list[tuple[float, JointState]] = []
        self.poses: list[tuple[float, PoseStamped]] = []
        self.diags: dict[str, DiagnosticStatus] = {}
        self.diag_count = 0  # diagnostics arrays of this node received so far
        self.node.create_subscription(
            JointState, f"{proc.prefix}/joint_states",
            lambda m: self.joint_states.append((time.monotonic(), m)), 50)
        self.node.create_subscription(
            PoseStamped, f"{proc.prefix}/ee_pose",
            lambda m: self.poses.append((time.monotonic(), m)), 50)
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, 10)
        self.pub = self.node.create_publisher(EECommandMsg, f"{proc.prefix}/heisd/ee_command", 10)
        self.step_index = 0
        self.clients = {
            name: self.node.create_client(Trigger, f"/{proc.name}/{name}")
            for name in ("enable", "disable", "estop", "clear_fault",
                         "emulator/clear_faults", "emulator/inject_collision")
        }
        self.link = self.node.create_client(SetBool, f"/{proc.name}/emulator/set_can_link")

    def _on_diag(self, msg: DiagnosticArray) -> None:
        ours = False
        for status in msg.status:  # "<node>: arm" -> "arm", this node's only
            node, _, what = status.name.partition(": ")
            if node == self.name:
                self.diags[what] = status
                ours = True
        self.diag_count += ours

    # --- waiting ---------------------------------------------------------------------------
    def spin(self, seconds: float) -> None:
        spin_for(self.executor, seconds)

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float = TIMEOUT_S) -> bool:
        return spin_until(self.executor, predicate, timeout_s)

    # --- services --------------------------------------------------------------------------
    def call(self, name: str, request=None):
        client = self.link if name == "emulator/set_can_link" else self.clients[name]
        assert client.wait_for_service(timeout_sec=TIMEOUT_S), self.proc.text()
        future = client.call_async(request if request is not None else Trigger.Request())
        self.executor.spin_until_future_complete(future, timeout_sec=TIMEOUT_S)
        assert future.done(), f"no answer from {name}: {self.proc.text()[-2000:]}"
        return future.result()

    def set_can_link(self, up: bool):
        return self.call("emulator/set_can_link", SetBool.Request(data=up))

    # --- diagnostics -----------------------------------------------------------------------
    def diag(self, what: str) -> tuple[DiagnosticStatus | None, dict[str, str]]:
        status = self.diags.get(what)
        return status, ({kv.key: kv.value for kv in status.values} if status else {})

    def value(self, what: str, key: str) -> str:
        return self.diag(what)[1].get(key, "")

    def fresh_diag(self) -> None:
        """Forget the diagnostics received so far and wait for the next ones."""
        self.diags.clear()
        assert self.wait_for(lambda: {"arm", "controller", "emulated arm"} <= set(self.diags))

    def wait_diagnostics(self, n: int) -> None:
        """Until ``n`` more diagnostics arrays arrived (the node is alive and publishing)."""
        target = self.diag_count + n
        assert self.wait_for(lambda: self.diag_count >= target), self.proc.text()[-2000:]

    def truth(self, key: str):
        return json.loads(self.value("emulated arm", key))

    def frames(self, can_id: int) -> int:
        return int(self.value("emulated arm", f"frames[0x{can_id:03X}]") or 0)

    # --- commands and state ----------------------------------------------------------------
    def send(self, dp=(0.0, 0.0, 0.0), dr=(0.0, 0.0, 0.0), gripper=OPEN, from_target=False,
             source=CommandSource.AR, frame_id="base_link", **fields) -> EECommandMsg:
        self.step_index += 1
        stamp = self.node.get_clock().now().nanoseconds * 1e-9  # a fresh observation
        msg = ee_command_to_msg(EECommand(dp, dr, gripper=gripper, source=source,
                                          gripper_from_target=from_target,
                                          step_index=self.step_index, frame_id=frame_id,
                                          stamp_s=stamp))
        for key, value in fields.items():
            setattr(msg, key, value)
        self.pub.publish(msg)
        return msg

    def pose(self) -> tuple[np.ndarray, np.ndarray]:
        """Newest /ee_pose as (position m, rotation matrix)."""
        p, o = self.poses[-1][1].pose.position, self.poses[-1][1].pose.orientation
        return np.array([p.x, p.y, p.z]), quat_xyzw_to_matrix((o.x, o.y, o.z, o.w))

    def gripper_width(self) -> float:
        return self.joint_states[-1][1].position[6]

    def settled_pose(self) -> tuple[np.ndarray, np.ndarray]:
        """The EE pose once the emulated arm is at its target and /ee_pose reports it there.

        Judged on diagnostics newer than this call.
        """

        def settled() -> bool:
            if not self.poses or "emulated arm" not in self.diags:
                return False
            position = self.truth("ee_position_m")
            target = self.value("emulated arm", "ee_target_m")
            at_target = not target or np.allclose(json.loads(target), position, rtol=0,
                                                  atol=1e-6)
            return at_target and np.allclose(self.pose()[0], position, rtol=0, atol=POS_TOL_M)

        self.fresh_diag()
        assert self.wait_for(settled), "the EE never settled"
        return self.pose()

    def handled(self) -> int:
        """Commands the driver finished with (executed, refused, or waited for the gripper)."""
        return sum(int(self.value("controller", f"commands_{k}") or 0)
                   for k in ("executed", "rejected", "waited"))

    def wait_pose(self, goal: np.ndarray, atol: float = POS_TOL_M) -> None:
        """Until /ee_pose is at ``goal``; a failure says where the arm is and why."""
        reached = self.wait_for(
            lambda: bool(self.poses) and np.allclose(self.pose()[0], goal, rtol=0, atol=atol)
        )
        assert reached, (
            f"EE at {self.pose()[0] if self.poses else None}, not {goal}; controller "
            f"{self.diag('controller')[1]}\n{self.proc.text()[-2000:]}"
        )

    def executed(self) -> int:
        return int(self.value("controller", "commands_executed") or 0)

    def ready(self) -> tuple[np.ndarray, np.ndarray]:
        """Bring the node to RUNNING (from whatever the last test left) and settle."""
        assert self.set_can_link(True).success
        assert self.call("emulator/clear_faults").success
        assert self.wait_for(lambda: self.call("clear_fault").success), self.proc.text()[-2000:]
        assert self.call("enable").success
        self.fresh_diag()
        assert self.wait_for(lambda: self.value("controller", "status") == "running")
        return self.settled_pose()

    def close(self) -> None:
        self.executor.shutdown()
        self.node.destroy_node()


@pytest.fixture(scope="module")
def context(module_ros_domain):
    domain = module_ros_domain
    ctx = rclpy.Context()
    rclpy.init(context=ctx, domain_id=domain)
    yield ctx, domain
    rclpy.shutdown(context=ctx)


@pytest.fixture(scope="module")
def driver(context, tmp_path_factory):
    ctx, domain = context
    proc = DriverProcess(tmp_path_factory.mktemp("driver"), domain, {
        "emulate": True,
        "interface": "virtual",
        "can_channel": "heisd-test-arm",
        "diagnostics_period_s": 0.1,
        "safety.workspace_max_m": [0.5, 0.35, Z_MAX],
        "emulator.initial_joints_rad": list(JOINTS),
        "emulator.gripper_speed_m_s": 0.05,  # 1.4 s for a full close: time to watch the arm
        # A loaded 2-core CI box can starve the node's threads for half a second; the shipped
        # 0.5 s would then latch a CAN fault in the middle of an unrelated test.
        "piper.stale_feedback_s": 1.0,
        # The command-age rule has its own test (test_driver_command_stream); here a starved
        # process that hands a fresh command over late must not make it stale.
        "controller.max_command_age_s": 30.0,
    })
    drv = Driver(ctx, proc)
    try:
        assert drv.wait_for(lambda: drv.pub.get_subscription_count() > 0), proc.text()
        yield drv
    finally:
        drv.close()
        code = proc.stop()
        assert code == 0, f"exit code {code}: {proc.text()[-3000:]}"


def test_starts_disabled_and_publishes_the_emulator_state_in_si_units(driver):
    drv = driver
    assert drv.wait_for(lambda: len(drv.poses) > 5 and len(drv.joint_states) > 5)
    drv.fresh_diag()
    # enable_on_start is false: nothing was enabled.
    assert drv.value("emulated arm", "motors_enabled") == "000000"
    arm, _ = drv.diag("arm")
    assert arm.level == DiagnosticStatus.WARN and "motors disabled" in arm.message
    assert drv.value("controller", "status") == "disabled"

    js = drv.joint_states[-1][1]
    assert list(js.name) == ["joint1", "joint2", "joint3", "joint4", "joint5", "joint6", "gripper"]
    np.testing.assert_allclose(js.position[:6], JOINTS, rtol=0, atol=2e-5)
    assert js.position[6] == pytest.approx(0.07, abs=1e-6)  # the emulator's opening, m
    fk = PiperKinematics(1).fk(np.array(JOINTS))
    pose = drv.poses[-1][1]
    assert pose.header.frame_id == "base_link"
    position, rotation = drv.pose()
    np.testing.assert_allclose(position, fk[:3, 3], rtol=0, atol=POS_TOL_M)
    assert rotation_angle(rotation, fk[:3, :3]) < ANGLE_TOL_RAD
    assert abs(np.linalg.norm([pose.pose.orientation.x, pose.pose.orientation.y,
                               pose.pose.orientation.z, pose.pose.orientation.w]) - 1) < 1e-9

    # Rate: one message per new feedback frame, at most feedback_rate_hz (200 Hz).
    n_js, n_pose = len(drv.joint_states), len(drv.poses)
    drv.spin(1.0)
    js_rate, pose_rate = len(drv.joint_states) - n_js, len(drv.poses) - n_pose
    print(f"/joint_states {js_rate} Hz, /ee_pose {pose_rate} Hz (configured 200 Hz)")
    assert 40 <= js_rate <= 260 and 40 <= pose_rate <= 260

    reply = drv.call("enable")
    assert reply.success, reply.message
    assert drv.wait_for(lambda: drv.value("emulated arm", "motors_enabled") == "111111")
    assert drv.wait_for(lambda: drv.value("controller", "status") in ("running", "watchdog_hold"))


def test_delta_commands_move_the_ee_by_the_commanded_deltas(driver):
    drv = driver
    start, rot0 = drv.ready()
    executed = drv.executed()
    step = np.array([0.01, 0.0, -0.005])
    for i in range(1, 4):
        drv.send(dp=tuple(step), dr=(0.0, 0.0, 0.03))
        assert drv.wait_for(lambda i=i: drv.executed() == executed + i)
        # The next delta only once the arm is there, as a policy at its rate would: a stream
        # faster than the speed limit loses its lead beyond one step (its own test covers that).
        goal = start + i * step
        drv.wait_pose(goal)
    # Delta rotations turn about the fixed base axes: R = Rz(0.09) @ R0.
    assert drv.wait_for(
        lambda: rotation_angle(drv.pose()[1], rpy_to_matrix([0, 0, 0.09]) @ rot0) < ANGLE_TOL_RAD
    )
    # The emulator decoded the EndPoseCtrl frames (0.001 mm units) into exactly this target.
    assert drv.wait_for(lambda: drv.executed() == executed + 3)
    for key in ("ee_target_m", "ee_position_m"):  # the newest diagnostics after the motion
        assert drv.wait_for(lambda k=key: np.allclose(drv.truth(k), goal, rtol=0, atol=1e-6))


def test_step_limit_and_workspace_box_clamp_the_target(driver):
    drv = driver
    start, _ = drv.ready()
    drv.send(dp=(0.5, 0.0, 0.0))  # 25x the 2 cm step limit
    goal = start + [0.02, 0.0, 0.0]
    drv.wait_pose(goal)
    assert drv.wait_for(lambda: "step_translation" in drv.value("controller", "last_clamped"))

    z = goal[2]
    for _ in range(6):  # climb 2 cm per command until the lid at Z_MAX stops it
        drv.send(dp=(0.0, 0.0, 0.02))
        z = min(z + 0.02, Z_MAX)
        drv.wait_pose([goal[0], goal[1], z])
        if z == Z_MAX:
            break
    assert drv.wait_for(lambda: "workspace_z_max" in drv.value("controller", "last_clamped"))
    drv.send(dp=(0.0, 0.0, 0.02))  # into the lid: executed, clamped, no motion
    assert drv.wait_for(lambda: drv.value("controller", "last_clamped")
                        == f"step {drv.step_index}: workspace_z_max")
    np.testing.assert_allclose(drv.settled_pose()[0], [goal[0], goal[1], Z_MAX], atol=POS_TOL_M)


def test_nan_foreign_frame_and_malformed_commands_move_nothing(driver):
    drv = driver
    start, _ = drv.ready()
    drv.send(dp=(0.01, 0.0, 0.0))
    start = start + [0.01, 0.0, 0.0]
    drv.wait_pose(start)
    drv.fresh_diag()
    executed, target = drv.executed(), drv.truth("ee_target_m")

    drv.send(dp=(math.nan, 0.0, 0.0))
    assert drv.wait_for(lambda: "non-finite" in drv.value("controller", "last_rejected_reason"))
    status, _ = drv.diag("controller")
    assert status.level == DiagnosticStatus.WARN and "non-finite" in status.message

    drv.send(dp=(0.01, 0.0, 0.0), frame_id="tool0")
    assert drv.wait_for(lambda: "'tool0'" in drv.value("controller", "last_rejected_reason"))

    drv.send(dp=(0.01, 0.0, 0.0), mode=7)
    assert drv.wait_for(
        lambda: "malformed EECommand: mode" in drv.value("controller", "last_rejected_reason")
    )
    assert drv.executed() == executed  # the three were handled in order, none executed
    np.testing.assert_allclose(drv.settled_pose()[0], start, rtol=0, atol=POS_TOL_M)
    np.testing.assert_allclose(drv.truth("ee_target_m"), target, rtol=0, atol=1e-9)


def test_watchdog_holds_the_pose_without_disabling_and_diagnostics_say_so(driver):
    drv = driver
    start, _ = drv.ready()
    drv.send(dp=(0.0, 0.01, 0.0))
    assert drv.wait_for(lambda: drv.value("controller", "status") == "running")
    drv.wait_pose(start + [0.0, 0.01, 0.0])
    # Commands stop: after watchdog_timeout_s (1 s) the controller holds.
    assert drv.wait_for(lambda: drv.value("controller", "status") == "watchdog_hold", 5.0)
    status, values = drv.diag("controller")
    assert status.level == DiagnosticStatus.WARN and "no accepted command" in status.message
    held, _ = drv.settled_pose()
    resent = drv.frames(0x154)
    assert drv.wait_for(lambda: drv.frames(0x154) >= resent + 10)  # 10 re-sends later...
    np.testing.assert_allclose(drv.pose()[0], held, rtol=0, atol=1e-7)  # ...still there
    assert drv.frames(0x154) > resent  # holding re-sends the last target (EndPoseCtrl)...
    assert drv.value("emulated arm", "motors_enabled") == "111111"  # ...and never disables
    drv.send(dp=(0.0, -0.01, 0.0))
    assert drv.wait_for(lambda: drv.value("controller", "status") == "running")
    drv.wait_pose(start)


def test_gripper_is_strict_and_the_arm_waits_while_it_moves(driver):
    drv = driver
    start, _ = drv.ready()
    assert drv.gripper_width() == pytest.approx(0.07, abs=1e-5)
    gripper_frames = drv.frames(0x159)

    # Not produced by the target VLA (or a verify-skipped draft claiming it): never executed,
    # while the arm part is.
    pos = start.copy()
    for from_target, source in [(False, CommandSource.AR)] * 3 + [
        (True, CommandSource.RETRIEVAL_SKIP)
    ] * 2:
        drv.send(dp=(0.0, 0.0, -0.004), gripper=CLOSED, from_target=from_target, source=source)
        pos = pos + [0.0, 0.0, -0.004]
        drv.wait_pose(pos)
    drv.fresh_diag()
    assert drv.frames(0x159) == gripper_frames and drv.value("controller", "gripper") == "open"
    assert drv.gripper_width() == pytest.approx(0.07, abs=1e-5)

    # From the target: the first asks (hysteresis 1 of 2), the arm part runs...
    drv.send(dp=(0.0, 0.0, -0.004), gripper=CLOSED, from_target=True)
    pos = pos + [0.0, 0.0, -0.004]
    drv.wait_pose(pos)
    assert drv.value("controller", "gripper") == "open"
    # ...the second closes the gripper; its arm part and the next command's wait.
    drv.send(dp=(0.0, 0.0, -0.004), gripper=CLOSED, from_target=True)
    drv.send(dp=(0.01, 0.0, 0.0), gripper=CLOSED, from_target=True)
    assert drv.wait_for(lambda: drv.value("controller", "status") == "gripper_wait")
    assert drv.value("controller", "gripper_phase") == "moving"
    assert drv.wait_for(lambda: "waits for the gripper" in drv.value(
        "controller", "last_rejected_reason"))
    assert drv.wait_for(lambda: drv.gripper_width() < 0.06)  # closing...
    np.testing.assert_allclose(drv.pose()[0], pos, rtol=0, atol=POS_TOL_M)  # ...arm parked
    assert drv.wait_for(lambda: drv.gripper_width() < 0.003, 5.0)
    assert drv.wait_for(lambda: drv.value("controller", "status") in ("running", "watchdog_hold"))
    assert drv.value("controller", "gripper") == "closed"
    assert drv.value("controller", "gripper_last_done") == "reached"
    np.testing.assert_allclose(drv.pose()[0], pos, rtol=0, atol=POS_TOL_M)
    assert drv.truth("gripper_target_m") == pytest.approx(0.0, abs=1e-9)
    drv.send(dp=(0.01, 0.0, 0.0), gripper=CLOSED, from_target=True)  # now the arm moves again
    drv.wait_pose(pos + [0.01, 0.0, 0.0])


def test_estop_reaches_the_arm_latches_and_recovers_after_its_reset(driver):
    drv = driver
    start, _ = drv.ready()
    stops = drv.frames(0x150)
    reply = drv.call("estop")
    assert reply.success and "emergency stop" in reply.message
    assert drv.wait_for(lambda: drv.value("emulated arm", "arm_status") == "EMERGENCY_STOP")
    assert drv.frames(0x150) == stops + 1
    assert drv.wait_for(lambda: "emergency_stop" in drv.diag("arm")[0].message)
    assert drv.diag("arm")[0].level == DiagnosticStatus.ERROR
    status, values = drv.diag("controller")
    assert values["status"] == "estop" and status.level == DiagnosticStatus.ERROR

    drv.send(dp=(0.0, 0.0, -0.01))
    assert drv.wait_for(lambda: "controller is estop" in drv.value(
        "controller", "last_rejected_reason"))
    np.testing.assert_allclose(drv.settled_pose()[0], start, rtol=0, atol=POS_TOL_M)
    refused = drv.call("clear_fault")
    assert not refused.success and "EMERGENCY_STOP" in refused.message

    assert drv.call("emulator/clear_faults").success  # the arm's own reset
    assert drv.wait_for(lambda: drv.call("clear_fault").success)
    drv.send(dp=(0.0, 0.0, -0.01))
    drv.wait_pose(start + [0.0, 0.0, -0.01])


def test_collision_reported_by_the_arm_is_an_error_and_a_hold(driver):
    drv = driver
    drv.ready()
    assert drv.call("emulator/inject_collision").success
    assert drv.wait_for(lambda: drv.value("controller", "status") == "fault")
    assert drv.wait_for(lambda: "collision" in drv.diag("arm")[0].message)
    assert drv.diag("arm")[0].level == DiagnosticStatus.ERROR
    assert "collision" in drv.value("controller", "faults")


def test_can_loss_is_an_error_the_node_holds_and_keeps_running(driver):
    drv = driver
    start, _ = drv.ready()
    log_before = drv.proc.text().count("CAN lost")
    assert drv.set_can_link(False).success
    assert drv.wait_for(lambda: drv.diag("arm")[0].message.startswith("CAN lost"), 10.0)
    arm, values = drv.diag("arm")
    assert arm.level == DiagnosticStatus.ERROR
    assert {"can_lost", "stale_feedback"} & set(values["faults"].split(","))
    assert drv.wait_for(lambda: drv.value("controller", "status") == "fault")
    status, _ = drv.diag("controller")
    assert status.level == DiagnosticStatus.ERROR and "holding" in status.message

    # No stale state is published while the arm is silent; the node keeps answering.
    drv.wait_diagnostics(2)  # the last /joint_states before the loss arrived meanwhile
    n = len(drv.joint_states)
    drv.send(dp=(0.0, 0.0, -0.01))
    assert drv.wait_for(lambda: "controller is fault" in drv.value(
        "controller", "last_rejected_reason"))
    drv.wait_diagnostics(15)  # 1.5 s of the node publishing diagnostics...
    assert len(drv.joint_states) == n  # ...and no joint state
    refused = drv.call("clear_fault")
    assert not refused.success and "still reports faults" in refused.message
    # Enabling cannot be confirmed on a silent bus: refused with the reason.
    refused = drv.call("enable")
    assert not refused.success and "CAN lost" in refused.message, refused.message
    # The driver tries to reopen the CAN port (here the bus is fine; the arm is silent).
    assert drv.wait_for(lambda: int(drv.value("arm", "link_reopens") or 0) >= 1)
    assert drv.proc.proc.poll() is None
    assert drv.value("emulated arm", "motors_enabled") == "111111"  # never disabled
    logged = drv.proc.text().count("CAN lost") - log_before
    assert 1 <= logged <= 2, drv.proc.text()[-3000:]  # throttled, not 50 lines a second

    assert drv.set_can_link(True).success
    assert drv.wait_for(lambda: len(drv.joint_states) > n)
    refused = drv.call("enable")  # the fault is latched until ~/clear_fault
    assert not refused.success and "~/clear_fault" in refused.message, refused.message
    assert drv.wait_for(lambda: drv.call("clear_fault").success)
    here, _ = drv.settled_pose()
    np.testing.assert_allclose(here, start, rtol=0, atol=POS_TOL_M)  # it held
    drv.send(dp=(0.0, 0.0, -0.01))
    drv.wait_pose(start + [0.0, 0.0, -0.01])


def test_disable_warns_that_the_arm_drops_and_commands_wait_for_enable(driver):
    drv = driver
    start, _ = drv.ready()
    reply = drv.call("disable")
    assert reply.success and "drops its arm" in reply.message
    assert drv.wait_for(lambda: drv.value("emulated arm", "motors_enabled") == "000000")
    assert drv.wait_for(lambda: drv.value("controller", "status") == "disabled")
    drv.send(dp=(0.01, 0.0, 0.0))
    assert drv.wait_for(lambda: "controller is disabled" in drv.value(
        "controller", "last_rejected_reason"))
    assert drv.call("enable").success
    drv.send(dp=(0.01, 0.0, 0.0))
    drv.wait_pose(start + [0.01, 0.0, 0.0])


def test_a_silent_arm_at_start_is_reported_and_the_node_keeps_running(context, tmp_path):
    ctx, domain = context
    proc = DriverProcess(tmp_path, domain, {
        "interface": "virtual",  # no emulator on this channel: nobody answers
        "can_channel": "heisd-test-nobody",
        "diagnostics_period_s": 0.1,
        "reconnect_period_s": 0.5,
        "reconnect_max_period_s": 1.0,
        "piper.connect_timeout_s": 0.5,
    }, name="silent_piper_driver", prefix="/silent")  # beside the other node, on its own topics
    drv = Driver(ctx, proc)
    try:
        assert drv.wait_for(lambda: drv.diag("arm")[0] is not None
                            and "no feedback from the PIPER" in drv.diag("arm")[0].message)
        arm, values = drv.diag("arm")
        assert arm.level == DiagnosticStatus.ERROR and arm.message.startswith("CAN")
        assert values["connected"] == "False" and "emulated arm" not in drv.diags
        reply = drv.call("enable")
        assert not reply.success and "no feedback from the PIPER" in reply.message
        drv.send(dp=(0.01, 0.0, 0.0))
        assert drv.wait_for(lambda: "driver not ready" in drv.value(
            "controller", "last_rejected_reason"))
        assert drv.diag("controller")[0].level == DiagnosticStatus.ERROR
        # It retries with back-off (0.5 s, then 1 s), logging the reason once.
        assert drv.wait_for(lambda: int(drv.value("arm", "connect_attempts") or 0) >= 4)
        assert proc.proc.poll() is None and proc.text().count("retrying in 0.5 s") == 1
        assert not drv.joint_states
    finally:
        drv.close()
        code = proc.stop()
    assert code == 0, proc.text()
