"""The one cost function: a decision's counters priced by a profile, and the device timeline.

:func:`price` serves the projection (mean priced ms per action) and real-time evaluation at a
profile (:class:`DeviceTimeline`: each decision's world latency, including the wait for a
check behind that still holds the device).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from heisd_ros.latency.counters import DecisionCounters
from heisd_ros.latency.profile import LatencyProfile

#: The parts of a priced decision, host parts last.
PARTS = ("vision", "prefill", "forwards", "drafter", "retrieval", "overhead")
_HOST_PARTS = ("retrieval", "overhead")


@dataclass(frozen=True)
class Priced:
    """One decision priced by a profile, ms.

    Attributes:
        parts: ms per part (:data:`PARTS`); vision, prefill, forwards and drafter run on the
            device, retrieval and overhead on the host.
        check_ms: device time of the check behind the decision starts (0: none).
    """

    parts: dict[str, float]
    check_ms: float = 0.0

    @property
    def device_ms(self) -> float:
        """Device work of the decision."""
        return sum(v for k, v in self.parts.items() if k not in _HOST_PARTS)

    @property
    def host_ms(self) -> float:
        """Host work of the decision (retrieval, overhead)."""
        return sum(self.parts[k] for k in _HOST_PARTS)

    @property
    def total_ms(self) -> float:
        """The decision's latency when it waits for nothing: the sum of its parts."""
        return sum(self.parts.values())


def price(counters: DecisionCounters | dict, profile: LatencyProfile) -> Priced:
    """Price one decision's counters (a ``DecisionCounters`` or its dict form)."""
    c = counters if isinstance(counters, DecisionCounters) else DecisionCounters.from_dict(
        counters)
    prefill = profile.prefill_ms(*c.forwards[0]) if c.forwards else 0.0
    later = sum(profile.forward_ms(*f) for f in c.forwards[1:])
    parts = {"vision": c.vision * profile.vision_ms, "prefill": prefill, "forwards": later,
             "drafter": (c.drafter_forwards * profile.drafter_forward_ms
                         + c.draft_calls * profile.draft_call_ms),
             "retrieval": c.retrievals * profile.retrieval_ms,
             "overhead": profile.overhead_ms}
    check = (0.0 if c.check is None else profile.forward_ms(*c.check) if c.check_from_cache
             else profile.prefill_ms(*c.check))
    return Priced(parts, check)


def work_ms(profile: LatencyProfile, stats, prefill: bool = True) -> float:
    """Priced ms of a decode path's target and draft work (``StepStats``), for path choices.

    ``prefill=False`` leaves out the first forward (the rounds after it only).
    """
    forwards = list(stats.forward_tokens)
    ms = sum(profile.forward_ms(*f) for f in forwards[1:])
    if prefill and forwards:
        ms += profile.prefill_ms(*forwards[0])
    return (ms + stats.drafter_forwards * profile.drafter_forward_ms
            + stats.draft_calls * profile.draft_call_ms)


@dataclass(frozen=True)
class Decision:
    """One decision on the device timeline.

    Attributes:
        latency_ms: from the decision's start to its command (wait included).
        wait_ms: how long it waited for a check behind that held what it needed.
        priced: its priced parts.
    """

    latency_ms: float
    wait_ms: float
    priced: Priced


class DeviceTimeline:
    """Decisions one after another on one device, in world time (s).

    A check behind starts when its decision's command is out and holds the device (or a core,
    per ``profile.check_occupies``) for its priced time. A later decision waits for it at its
    start if the check holds the device; with ``"core"`` only a decision that collects the
    verdict waits. ``scale`` multiplies every duration (2: a machine twice as slow).
    """

    def __init__(self, profile: LatencyProfile, scale: float = 1.0):
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"scale: expected a finite number > 0, got {scale!r}")
        self.profile, self.scale = profile, float(scale)
        self.busy_until_s = -math.inf

    def reset(self) -> None:
        """A new episode: nothing holds the device."""
        self.busy_until_s = -math.inf

    def decide(self, start_s: float, counters: DecisionCounters | dict) -> Decision:
        """Place a decision that starts at world time ``start_s``."""
        c = counters if isinstance(counters, DecisionCounters) else DecisionCounters.from_dict(
            counters)
        priced = price(c, self.profile)
        waits = self.profile.check_occupies == "device" or c.collects_verdict
        wait_s = max(0.0, self.busy_until_s - start_s) if waits else 0.0
        latency_s = wait_s + priced.total_ms * self.scale / 1e3
        if priced.check_ms > 0:
            self.busy_until_s = start_s + latency_s + priced.check_ms * self.scale / 1e3
        return Decision(latency_s * 1e3, wait_s * 1e3, priced)
