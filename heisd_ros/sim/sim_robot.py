"""The MuJoCo PIPER behind :class:`heisd_ros.robot.base.Robot`, for the sim node.

With this adapter the sim node drives the simulated arm through the same
:class:`~heisd_ros.robot.controller.RobotController` (safety filter, strict gripper) as the
PIPER driver drives the real one. By default the sim is *command driven* (lockstep): each
``act`` or ``hold`` runs one control period of physics (``SimConfig.control_rate_hz``), so
holding while the gripper closes lets the gripper move, and nothing moves between commands.
With ``realtime=True`` ``act`` only hands the target to the arm's joint servos
(:meth:`PiperSimEnv.command`) and ``hold`` does nothing: the owner runs physics with the clock
(:meth:`PiperSimEnv.advance`), as a real PIPER tracks its latest target whether or not a
command comes. Times are simulation seconds (``MjData.time``), which the controller's clock
must use too (:meth:`now_s`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from heisd_ros.robot.base import EETarget, Robot, RobotError, RobotFault, RobotState
from heisd_ros.sim.env import PiperSimEnv, StepResult


class SimRobot(Robot):
    """A :class:`PiperSimEnv` as a :class:`Robot` (see the module docstring)."""

    def __init__(self, env: PiperSimEnv, realtime: bool = False) -> None:
        self.env = env
        self.realtime = realtime
        #: Limits that changed the last real-time target (``StepResult.limits``).
        self.last_limits: tuple[str, ...] = ()
        self._connected = False
        self._enabled = True  # the simulated motors are on; disable() turns them off
        self._estopped = False
        self._target: EETarget | None = None
        self.last_step: StepResult | None = None
        self.steps = 0  # control periods run (act + hold)

    # ---- life cycle ------------------------------------------------------------------
    def connect(self) -> None:
        """Nothing to open: the simulation is in this process."""
        self._connected = True

    def disconnect(self) -> None:
        """Forget the connection (the env stays; its owner closes it)."""
        self._connected = False

    @property
    def is_connected(self) -> bool:
        """True between connect() and disconnect()."""
        return self._connected

    def now_s(self) -> float:
        """Simulation time in seconds (the clock of ``observe().stamp_s``)."""
        return float(self.env.data.time)

    def reset_episode(self) -> None:
        """Forget the last target and step after ``env.reset`` (the arm holds where it is)."""
        self._target, self.last_step = None, None

    # ---- state and motion ------------------------------------------------------------
    def observe(self) -> RobotState:
        """The simulated state; an emergency stop shows as a fault, disabled motors as off."""
        if not self._connected:
            raise RobotError("SimRobot.observe() while disconnected: call connect() first")
        state = self.env.robot_state()
        if self._estopped:
            state = dataclasses.replace(state, faults=frozenset({RobotFault.EMERGENCY_STOP}),
                                        detail="emergency stop (sim): clear it with ~/reset")
        if not self._enabled:
            state = dataclasses.replace(state, motors_enabled=(False,) * 6)
        return state

    def act(self, target: EETarget) -> None:
        """Run one control period towards ``target`` (gripper width when given)."""
        self._check_can_move()
        self._target = target
        self._run(target)

    def hold(self) -> None:
        """Run one control period at the last target (lets a moving gripper finish).

        In real time the servos already hold the last target while physics runs: nothing to do.
        """
        if self.realtime:
            return
        if self._target is None or not self._connected or self._estopped or not self._enabled:
            return
        self._run(EETarget(self._target.position_m, self._target.rpy_rad))

    def _run(self, target: EETarget) -> None:
        if self.realtime:
            self.last_limits = self.env.command(np.asarray(target.position_m),
                                                np.asarray(target.rpy_rad),
                                                target.gripper_width_m)
            return
        self.last_step = self.env.move_to(np.asarray(target.position_m),
                                          np.asarray(target.rpy_rad), target.gripper_width_m)
        self.steps += 1

    def _check_can_move(self) -> None:
        if not self._connected:
            raise RobotError("SimRobot.act() while disconnected")
        if self._estopped:
            raise RobotError("SimRobot.act() after an emergency stop")

    # ---- motors ----------------------------------------------------------------------
    def enable(self, timeout_s: float | None = None) -> None:
        """Motors on (immediately)."""
        self._enabled = True

    def disable(self) -> None:
        """Motors off: the sim arm then ignores targets (it does not fall)."""
        self._enabled = False

    def estop(self) -> None:
        """Latch an emergency stop until :meth:`clear_estop`."""
        self._estopped = True

    def clear_estop(self) -> None:
        """Release the emergency stop (what a reset does)."""
        self._estopped = False
