"""Small helpers for tests that wait on threads or compare in SI units."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np


def allclose(a, b, atol: float = 1e-9) -> bool:
    """Absolute tolerance only (numpy's default relative term would hide mm errors)."""
    return bool(np.allclose(a, b, rtol=0.0, atol=atol))


def wait_until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    """Poll ``predicate`` every 10 ms until it holds or ``timeout_s`` passes; return its value."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()
