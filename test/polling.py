"""Small helpers for tests that wait on a condition (threads, ROS callbacks) or compare in SI units.

A test waits for what it expects with a deadline, never for a fixed time: :func:`wait_until`
when other threads do the work, :func:`spin_until` when this thread must run the ROS
callbacks that make the condition true. Code that measures time takes a
:class:`ManualClock` in tests, so a "slow" step is a step of the clock, not a sleep.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np


def allclose(a, b, atol: float = 1e-9) -> bool:
    """Absolute tolerance only (numpy's default relative term would hide mm errors)."""
    return bool(np.allclose(a, b, rtol=0.0, atol=atol))


def wait_until(predicate: Callable[[], bool], timeout_s: float = 5.0,
               poll_s: float = 0.01) -> bool:
    """Whether ``predicate`` holds within ``timeout_s`` (looked at every ``poll_s``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll_s)
    return predicate()


def spin_until(executor, condition: Callable[[], bool], timeout_s: float = 20.0,
               spin_s: float = 0.05) -> bool:
    """Run ``executor``'s callbacks until ``condition()`` holds or ``timeout_s`` passes.

    Returns whether the condition held. The condition is looked at after every
    ``executor.spin_once`` (one callback, or ``spin_s`` without work). Callers assert the result
    with a message that says what never came.
    """
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            return False
        executor.spin_once(timeout_sec=spin_s)
    return True


def spin_for(executor, seconds: float, spin_s: float = 0.01) -> None:
    """Run ``executor``'s callbacks for ``seconds``.

    Only for a window in which to count messages or to see that nothing (more) arrives; a test
    that waits for something to happen uses :func:`spin_until`.
    """
    deadline = time.monotonic() + seconds
    while (left_s := deadline - time.monotonic()) > 0:
        executor.spin_once(timeout_sec=min(spin_s, left_s))


class ManualClock:
    """A clock (s) that moves only when the test moves it; pass it where code reads a clock."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self.now_s = start_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds
