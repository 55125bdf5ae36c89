"""The real piper_sdk against the emulated PIPER over python-can's virtual bus.

Every test gets its own virtual channel (piper_sdk keeps one interface per channel name).
Nothing waits on time: "the arm did not move" is checked once the emulator has handled the
frames (its frame counters) and has stepped its model again (a newer feedback frame).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time

import numpy as np
import pytest
from piper_sdk import C_PiperInterface_V2

from heisd_ros.geometry.rotations import rotation_angle, rpy_to_matrix
from heisd_ros.robot import piper_can as pc
from heisd_ros.robot.base import ArmStatus, EETarget, RobotError, RobotFault
from heisd_ros.robot.dry_run import emulated_piper_robot, unique_channel
from heisd_ros.robot.emulated_piper import EmulatedPiper, EmulatedPiperConfig
from heisd_ros.robot.piper import PiperConfig, PiperRobot
from heisd_ros.robot.piper_kinematics import PiperKinematics
from heisd_ros.robot.piper_sdk_log import capture_sdk_log
from test.polling import allclose, wait_until

# piper_sdk 0.6.2 still passes python-can's deprecated `bustype`.
pytestmark = pytest.mark.filterwarnings(
    "ignore:The 'bustype' argument is deprecated:DeprecationWarning"
)

JOINTS = (0.3, 1.1, -1.2, 0.2, 0.5, -0.4)


def emulator(**kwargs) -> EmulatedPiperConfig:
    return EmulatedPiperConfig(
        channel="replaced", initial_joints_rad=JOINTS, initial_gripper_width_m=0.042, **kwargs
    )


def frames(emu: EmulatedPiper, can_id: int) -> int:
    return emu.state().frames_received.get(can_id, 0)


def act_and_wait_until_handled(emu: EmulatedPiper, robot: PiperRobot, target: EETarget) -> None:
    """Send ``target``; return once the emulator has handled its last frame (0x154)."""
    sent = frames(emu, pc.END_POSE_CTRL[2])
    robot.act(target)
    assert wait_until(lambda: frames(emu, pc.END_POSE_CTRL[2]) > sent)


def wait_for_new_feedback(robot: PiperRobot) -> None:
    """Until a feedback frame newer than now arrives: the emulator stepped its model since."""
    stamp = robot.observe().stamp_s
    assert wait_until(lambda: robot.observe().stamp_s > stamp)


def kill_the_bus(channel: str) -> None:
    """The interface disappears under piper_sdk: its python-can buses fail every call."""
    port = C_PiperInterface_V2(can_name=channel).GetCanBus()  # the per-channel singleton
    port.recv_bus.shutdown()
    port.send_bus.shutdown()


def reader_cpu_s() -> float:
    """CPU time (s) of piper_sdk's reader threads ("ReadCan") in this process (Linux)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for thread in threading.enumerate():
        if "ReadCan" in thread.name and thread.native_id is not None:
            try:
                with open(f"/proc/self/task/{thread.native_id}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except FileNotFoundError:
                continue  # ended meanwhile
            total += (int(fields[11]) + int(fields[12])) / ticks  # utime + stime
    return total


def test_feedback_read_through_the_sdk_matches_the_emulator_in_si_units():
    with emulated_piper_robot(emulator()) as (emu, robot):
        truth = emu.state()
        state = robot.observe()
    # Wire resolution: 0.001 deg for joints and angles, 0.001 mm for positions and the gripper.
    assert allclose(state.joint_positions_rad, JOINTS, atol=1e-5)
    assert allclose(state.joint_positions_rad, truth.joints_rad, atol=1e-5)
    assert allclose(state.ee_position_m, truth.ee_position_m, atol=2e-6)
    assert rotation_angle(rpy_to_matrix(state.ee_rpy_rad), rpy_to_matrix(truth.ee_rpy_rad)) < 1e-4
    assert state.gripper_width_m == pytest.approx(0.042, abs=1e-6)
    assert state.ok and state.arm_status == ArmStatus.NORMAL and state.motion_done
    assert state.motors_enabled == (False,) * 6 and not state.gripper_enabled
    assert state.stamp_s > 0


def test_end_pose_target_moves_the_emulated_ee_there():
    with emulated_piper_robot(emulator(), start_enabled=True) as (emu, robot):
        start = robot.observe()
        goal = EETarget(
            start.ee_position_m + [0.03, -0.02, 0.04],
            start.ee_rpy_rad + [0.0, -0.1, 0.15],
            gripper_width_m=0.02,
        )
        robot.act(goal)
        assert wait_until(
            lambda: (
                allclose(emu.state().ee_position_m, goal.position_m, atol=1e-6)
                and emu.state().gripper_width_m == pytest.approx(0.02, abs=1e-9)
            )
        )
        truth = emu.state()
        assert rotation_angle(rpy_to_matrix(truth.ee_rpy_rad), rpy_to_matrix(goal.rpy_rad)) < 1e-5
        # The SDK sent CAN control mode, MOVE P, the configured speed.
        assert (truth.ctrl_mode, truth.move_mode, truth.speed_percent) == (
            pc.CTRL_MODE_CAN,
            pc.MOVE_P,
            50,
        )
        assert truth.gripper_effort_nm == pytest.approx(1.0)
        assert wait_until(
            lambda: allclose(robot.observe().ee_position_m, goal.position_m, atol=2e-6)
        )
        assert wait_until(lambda: robot.observe().motion_done)
        state = robot.observe()
        assert state.gripper_width_m == pytest.approx(0.02, abs=1e-6)
        # The joints followed (IK): their FK reproduces the pose (joints travel in 0.001 deg).
        reached = PiperKinematics().fk(state.joint_positions_rad)
        assert allclose(reached[:3, 3], goal.position_m, atol=5e-5)
        assert rotation_angle(reached[:3, :3], rpy_to_matrix(goal.rpy_rad)) < 1e-4


def test_joint_ctrl_through_the_sdk_moves_the_emulated_joints():
    with emulated_piper_robot(emulator(), start_enabled=True) as (emu, robot):
        sdk = C_PiperInterface_V2(can_name=robot.config.can_channel)  # the per-channel singleton
        goal = np.array([-0.2, 1.3, -0.9, 0.1, -0.3, 0.6])
        sdk.MotionCtrl_2(pc.CTRL_MODE_CAN, pc.MOVE_J, 100, 0x00)
        sdk.JointCtrl(*(int(round(np.degrees(q) * 1000)) for q in goal))
        assert wait_until(lambda: allclose(emu.state().joints_rad, goal, atol=1e-5))
        assert wait_until(lambda: allclose(robot.observe().joint_positions_rad, goal, atol=2e-5))
        state = robot.observe()
        expected = PiperKinematics().fk(emu.state().joints_rad)
        assert allclose(
            state.ee_position_m, expected[:3, 3], atol=2e-6
        )  # EE follows the joints' FK


def test_hold_resends_the_last_target():
    with emulated_piper_robot(emulator(), start_enabled=True) as (emu, robot):
        robot.hold()  # nothing commanded yet: nothing sent
        goal = EETarget(
            robot.observe().ee_position_m + [0.0, 0.0, 0.01], robot.observe().ee_rpy_rad
        )
        robot.act(goal)
        # The bus keeps order: once the emulator holds the goal, an earlier hold frame would
        # have been counted before it.
        assert wait_until(lambda: emu.state().ee_target_m is not None)
        assert frames(emu, pc.END_POSE_CTRL[2]) == 1
        robot.hold()
        assert wait_until(lambda: frames(emu, pc.END_POSE_CTRL[2]) == 2)
        assert allclose(emu.state().ee_target_m, goal.position_m, atol=1e-6)


def test_enable_disable_and_estop_reach_the_emulator():
    with emulated_piper_robot(emulator()) as (emu, robot):
        start = robot.observe().ee_position_m
        act_and_wait_until_handled(
            emu, robot, EETarget(start + [0.02, 0, 0], robot.observe().ee_rpy_rad)
        )
        wait_for_new_feedback(robot)
        assert emu.state().ee_target_m is None  # disabled arms take no target...
        assert allclose(emu.state().ee_position_m, start, atol=2e-6)  # ...and do not move

        robot.enable(timeout_s=3.0)
        assert emu.state().motors_enabled == (True,) * 6 and emu.state().gripper_enabled
        assert emu.state().gripper_width_m == pytest.approx(
            0.042, abs=1e-6
        )  # enabling did not move it
        assert robot.observe().enabled

        robot.disable()
        assert wait_until(lambda: emu.state().motors_enabled == (False,) * 6)
        assert wait_until(lambda: not robot.observe().enabled)

        robot.enable(timeout_s=3.0)
        robot.estop()
        assert wait_until(lambda: emu.state().arm_status == ArmStatus.EMERGENCY_STOP)
        assert wait_until(lambda: RobotFault.EMERGENCY_STOP in robot.observe().faults)
        act_and_wait_until_handled(
            emu, robot, EETarget(start + [0.02, 0, 0], robot.observe().ee_rpy_rad)
        )
        wait_for_new_feedback(robot)
        assert emu.state().ee_target_m is None
        assert allclose(emu.state().ee_position_m, start, atol=2e-6)  # stopped arms do not move


def test_enable_times_out_with_advice_when_drivers_never_enable():
    with emulated_piper_robot(emulator()) as (emu, robot):
        emu.set_can_link(False)  # enable frames are lost
        with pytest.raises(RobotError, match="did not report all motors enabled"):
            robot.enable(timeout_s=0.3)


@pytest.mark.parametrize(
    ("inject", "fault", "words"),
    [
        (lambda emu: emu.inject_collision(3), RobotFault.COLLISION, "joint 3"),
        (lambda emu: emu.inject_joint_limit(2), RobotFault.JOINT_LIMIT, "[2]"),
        (
            lambda emu: emu.inject_joint_communication_error(5),
            RobotFault.JOINT_COMMUNICATION,
            "[5]",
        ),
    ],
)
def test_injected_arm_faults_surface_as_error_states(inject, fault, words):
    with emulated_piper_robot(emulator(), start_enabled=True) as (emu, robot):
        assert robot.observe().ok
        inject(emu)
        # 0x2A1 (status) and 0x261-0x266 (per-motor bits) arrive at different rates.
        assert wait_until(
            lambda: fault in robot.observe().faults and words in robot.observe().detail
        )
        state = robot.observe()
        assert not state.ok
        start = state.ee_position_m
        act_and_wait_until_handled(emu, robot, EETarget(start + [0.02, 0, 0], state.ee_rpy_rad))
        wait_for_new_feedback(robot)
        assert emu.state().ee_target_m is None
        assert allclose(emu.state().ee_position_m, start, atol=2e-6)  # a faulted arm does not move
        emu.clear_faults()
        assert wait_until(lambda: robot.observe().ok)


def test_lost_can_is_reported_as_an_error_state_and_recovers():
    with emulated_piper_robot(emulator()) as (emu, robot):
        assert robot.observe().ok
        emu.set_can_link(False)
        lost = {RobotFault.CAN_LOST, RobotFault.STALE_FEEDBACK}
        lost_at = time.monotonic()
        assert wait_until(lambda: bool(robot.observe().faults & lost), timeout_s=3.0)
        print(f"CAN loss detected after {time.monotonic() - lost_at:.2f} s")
        assert "CAN" in robot.observe().detail or "old" in robot.observe().detail
        robot.hold()  # sending into a dead bus must not raise
        emu.set_can_link(True)
        assert wait_until(lambda: robot.observe().ok, timeout_s=3.0)


def test_own_command_frames_do_not_mask_a_silent_arm():
    with emulated_piper_robot(emulator(), start_enabled=True) as (emu, robot):
        robot.act(EETarget(robot.observe().ee_position_m, robot.observe().ee_rpy_rad))
        emu.set_can_link(False)

        def holding_until_stale() -> bool:
            robot.hold()  # 50 Hz of our own frames on the bus, as a holding driver sends
            return RobotFault.STALE_FEEDBACK in robot.observe().faults

        assert wait_until(holding_until_stale, timeout_s=3.0)
        assert "s old" in robot.observe().detail


def test_a_bus_that_died_is_reopened_quietly_and_nothing_spins(capfd):
    capture = capture_sdk_log()
    with emulated_piper_robot(emulator(), start_enabled=True) as (emu, robot):
        start = robot.observe()
        robot.act(start.ee_target)
        capfd.readouterr()
        logged = capture.total
        kill_the_bus(robot.config.can_channel)
        lost = {RobotFault.CAN_LOST, RobotFault.STALE_FEEDBACK}
        assert wait_until(lambda: bool(robot.observe().faults & lost), timeout_s=3.0)
        robot.hold()  # into the dead bus: piper_sdk logs "send failed" for every frame...
        assert capture.total > logged
        robot.reopen()  # ...until the port is reopened: fresh buses, the reader restarted
        assert wait_until(lambda: robot.observe().ok, timeout_s=3.0)
        held = frames(emu, pc.END_POSE_CTRL[2])
        robot.hold()  # the last target survived the reopening
        assert wait_until(lambda: frames(emu, pc.END_POSE_CTRL[2]) == held + 1)
        goal = EETarget(start.ee_position_m + [0.0, 0.01, 0.0], start.ee_rpy_rad)
        robot.act(goal)
        assert wait_until(lambda: allclose(emu.state().ee_position_m, goal.position_m, atol=1e-6))
        # The reader does not spin: over 100 feedback frames (0.5 s) it used little CPU.
        cpu, stamp = reader_cpu_s(), robot.observe().stamp_s
        assert wait_until(lambda: robot.observe().stamp_s > stamp + 0.5, timeout_s=10.0)
        assert reader_cpu_s() - cpu < 0.2
    out, err = capfd.readouterr()
    assert out == "" and err == "", (out + err)[:2000]  # the SDK's lines were captured


def test_reopen_on_a_missing_interface_fails_and_leaves_the_port_closed():
    capture = capture_sdk_log()
    with emulated_piper_robot(emulator(), start_enabled=True) as (emu, robot):
        start = robot.observe()
        robot.act(start.ee_target)
        virtual = robot.config
        # The same channel name, but on socketcan, where no such interface exists.
        robot.config = dataclasses.replace(virtual, interface="socketcan", check_can_port=True)
        with pytest.raises(RobotError, match="does not exist"):
            robot.reopen()
        state = robot.observe()
        assert RobotFault.CAN_LOST in state.faults and "does not exist" in state.detail
        logged = capture.total
        robot.hold()  # nothing to send on: nothing sent, nothing logged
        assert capture.total == logged
        with pytest.raises(RobotError, match="not sent"):
            robot.act(start.ee_target)
        robot.config = virtual  # the interface is back
        robot.reopen()
        assert wait_until(lambda: robot.observe().ok, timeout_s=3.0)
        goal = EETarget(start.ee_position_m + [0.0, 0.0, -0.01], start.ee_rpy_rad)
        robot.act(goal)
        assert wait_until(lambda: allclose(emu.state().ee_position_m, goal.position_m, atol=1e-6))


def test_connect_without_an_arm_fails_with_a_hint():
    robot = PiperRobot(
        PiperConfig(can_channel=unique_channel(), interface="virtual", connect_timeout_s=0.3)
    )
    with pytest.raises(RobotError, match="no feedback from the PIPER"):
        robot.connect()
    assert not robot.is_connected
    with pytest.raises(RobotError, match="not connected"):
        robot.observe()


def test_connect_to_a_missing_interface_names_it_and_prints_nothing(capfd):
    channel = unique_channel("heisd-no-such-can")  # no such network interface
    robot = PiperRobot(PiperConfig(can_channel=channel, interface="socketcan"))
    for _ in range(3):
        with pytest.raises(RobotError, match=f"CAN socket {channel} does not exist"):
            robot.connect()
    out, err = capfd.readouterr()
    assert out == "" and err == "", (out + err)[:2000]


def test_reconnect_on_the_same_channel():
    channel = unique_channel()
    config = PiperConfig(can_channel=channel, interface="virtual")
    with EmulatedPiper(EmulatedPiperConfig(channel=channel, initial_joints_rad=JOINTS)):
        for _ in range(2):
            robot = PiperRobot(config)
            robot.connect()
            assert allclose(robot.observe().joint_positions_rad, JOINTS, atol=1e-5)
            robot.disconnect()
            robot.disconnect()  # twice is fine


@pytest.mark.parametrize(
    ("kwargs", "field_name"),
    [
        ({"can_channel": ""}, "can_channel"),
        ({"move_mode": "j"}, "move_mode"),
        ({"speed_percent": 0}, "speed_percent"),
        ({"gripper_effort_nm": 6.0}, "gripper_effort_nm"),
        ({"stale_feedback_s": 0}, "stale_feedback_s"),
    ],
)
def test_piper_config_rejects_bad_values_naming_the_field(kwargs, field_name):
    with pytest.raises(ValueError, match=field_name):
        PiperConfig(**kwargs)


def test_emulator_config_rejects_bad_values_naming_the_field():
    with pytest.raises(ValueError, match="initial_joints_rad"):
        EmulatedPiperConfig(channel="x", initial_joints_rad=(0, -1.0, 0, 0, 0, 0))  # j2 >= 0
    with pytest.raises(ValueError, match="feedback_rate_hz"):
        EmulatedPiperConfig(channel="x", feedback_rate_hz=0)
