"""The policy node's /diagnostics: step latency by stage of the ROS path, and the status.

Latency is measured from the image stamp (the observation's time) to the command publish; the
stages before the decoder are the transport of the newer camera frame and the wait until the
step started (conversion, queueing, the gate).
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np
from diagnostic_msgs.msg import DiagnosticStatus, KeyValue


class StepLatency:
    """Latency figures of the last ``window`` steps, ms."""

    def __init__(self, window: int) -> None:
        """Keep the newest ``window`` steps."""
        self.latency_ms: deque = deque(maxlen=window)  # image stamp -> command publish
        self.decode_ms: deque = deque(maxlen=window)  # steps sent
        self.step_ms: deque = deque(maxlen=window)  # every decoded step, sent or held
        self.held_stale: deque = deque(maxlen=window)  # per decoded step: held as stale
        self.input_ms: deque = deque(maxlen=window)  # image stamp -> step start
        self.transport_ms: deque = deque(maxlen=window)  # stamp -> last frame in
        self._frame_rx: dict[float, float] = {}  # frame stamp -> receipt time (newest only)

    def frame_received(self, stamp_s: float, now_s: float) -> None:
        """A camera frame stamped ``stamp_s`` arrived at ``now_s`` (the later camera counts)."""
        self._frame_rx = {k: v for k, v in self._frame_rx.items() if k >= stamp_s - 1.0}
        self._frame_rx[stamp_s] = max(self._frame_rx.get(stamp_s, 0.0), now_s)

    def step_started(self, stamp_s: float, now_s: float) -> None:
        """A step on the frames stamped ``stamp_s`` started (decoded) at ``now_s``."""
        self.input_ms.append((now_s - stamp_s) * 1e3)
        received = self._frame_rx.get(stamp_s)
        if received is not None:
            self.transport_ms.append((received - stamp_s) * 1e3)

    def decoded(self, decode_ms: float, held_stale: bool) -> None:
        """A step decoded in ``decode_ms`` (observation handed over to action back)."""
        self.step_ms.append(decode_ms)
        self.held_stale.append(bool(held_stale))

    def decode_p50_ms(self, min_steps: int = 1) -> float | None:
        """Median decode time of the recent decoded steps; None with fewer than min_steps."""
        if len(self.step_ms) < max(1, min_steps):
            return None
        return float(np.median(self.step_ms))

    def published(self, stamp_s: float, now_s: float, decode_ms: float) -> None:
        """The command of the frames stamped ``stamp_s`` went out at ``now_s``."""
        self.latency_ms.append((now_s - stamp_s) * 1e3)
        self.decode_ms.append(decode_ms)

    def summary(self) -> dict[str, float]:
        """Latency of the recent steps in ms, and the ROS share.

        Image stamp -> command publish (p50, p99), image stamp -> step start (transport,
        conversion, queueing; p50), image stamp -> receipt of the newer frame (transport;
        p50), and the median share of a step's latency spent outside the decoder (ROS
        messages, conversion, the gate), over the steps sent; the decode time (p50, p99:
        observation handed to the decoder to action back) and the share held as stale, over
        every decoded step, sent or held.
        """
        out = {}
        if self.step_ms:
            d50, d99 = np.percentile(self.step_ms, [50, 99])
            out = {"decode_p50_ms": float(d50), "decode_p99_ms": float(d99),
                   "decoded_steps": float(len(self.step_ms)),
                   "held_stale_share": float(np.mean(self.held_stale))}
        lat, dec = np.array(self.latency_ms), np.array(self.decode_ms)
        if not len(lat):
            return out
        p50, p99 = np.percentile(lat, [50, 99])
        share = float(np.median(np.clip((lat - dec) / np.maximum(lat, 1e-9), 0.0, 1.0)))
        return {"latency_p50_ms": float(p50), "latency_p99_ms": float(p99),
                "input_p50_ms": float(np.median(self.input_ms)),
                "transport_p50_ms": float(np.median(self.transport_ms))
                if self.transport_ms else math.nan,
                "ros_overhead_share": share, "steps": float(len(lat)), **out}


def policy_status(name: str, values: dict[str, str], config_error: str,
                  last_problem: str) -> DiagnosticStatus:
    """ERROR while not configured, WARN after a refused input, else OK, with ``values``."""
    if config_error:
        level, message = DiagnosticStatus.ERROR, config_error
    elif last_problem:
        level, message = DiagnosticStatus.WARN, last_problem
    else:
        level, message = DiagnosticStatus.OK, "running"
    return DiagnosticStatus(level=level, name=name, message=message,
                            values=[KeyValue(key=k, value=v) for k, v in values.items()])
