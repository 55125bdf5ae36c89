"""One pairing rule for every tool: the message nearest in header stamp, in either order.

Each frame of the primary (third-person) camera is paired with the wrist frame nearest to
it in header stamp, earlier or later, if that one lies within a tolerance (50 ms by
default); a tie goes to the earlier frame. A wrist frame may serve several primary frames
(a 30 Hz primary camera with a 10 Hz wrist camera pairs every primary frame). The robot
state (joint states, EE pose) of a frame is the message of each stream nearest to the
frame's stamp, within its own tolerance.

Who applies it:

- ``heisd-replay`` (:mod:`heisd_ros.eval.bag_frames`) and ``heisd-build-db`` from bags
  (:mod:`heisd_ros.data.bag_episodes`) see the whole bag, so "nearest" is exact;
- the policy node's input gate (:mod:`heisd_ros.nodes.policy_inputs`) can only choose among
  the frames that have arrived: it pairs the newest primary frame that has a wrist frame
  within the tolerance, the nearest one held. It agrees with the offline tools whenever
  the cameras' frames are further apart than the tolerance (e.g. two 10 Hz cameras with
  up to +-25 ms of offset and jitter); with two fast cameras it may take an earlier wrist
  frame where a later, nearer one was still on its way.

:class:`PairingReport` counts what a tool found, paired and dropped (and why) for its
report line.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

#: Largest stamp difference of two camera frames taken as one observation, s.
DEFAULT_PAIR_TOLERANCE_S = 0.05


def nearest(stamps: Sequence[float] | np.ndarray, at: float, tolerance: float) -> int | None:
    """Index of the stamp nearest to ``at`` in sorted ``stamps`` within ``tolerance``.

    Either side counts; of two equally near stamps the earlier wins. Stamps and tolerance
    share one unit (s, or integer ns for exact bag stamps). None when no stamp is close.
    """
    n = len(stamps)
    if n == 0:
        return None
    i = int(np.searchsorted(stamps, at, side="left"))
    best = None
    for j in (i - 1, i):  # the last stamp before ``at`` and the first at or after it
        if 0 <= j < n and (best is None or abs(stamps[j] - at) < abs(stamps[best] - at)):
            best = j
    return best if abs(stamps[best] - at) <= tolerance else None


def all_finite(values) -> bool:
    """Whether every number of ``values`` (arrays or numbers) is finite.

    A robot state with NaN or inf pairs with no frame (the policy node refuses it too).
    """
    return all(np.all(np.isfinite(np.asarray(v, dtype=np.float64))) for v in values)


def thin_to_rate(stamps: Sequence[float] | np.ndarray, rate_hz: float | None) -> list[int]:
    """Indices of sorted ``stamps`` (s) kept at no more than ``rate_hz``.

    The first frame is kept, then each frame at least one period after the last kept one
    (less 5% of a period, so camera jitter does not skip a frame). None keeps every frame.
    """
    if rate_hz is None:
        return list(range(len(stamps)))
    if not rate_hz > 0:
        raise ValueError(f"rate_hz: expected > 0, got {rate_hz!r}")
    period, kept = 0.95 / rate_hz, []
    for i, stamp in enumerate(stamps):
        if not kept or stamp - stamps[kept[-1]] >= period:
            kept.append(i)
    return kept


@dataclass
class PairingReport:
    """What a tool did with a bag's frames: found per stream, considered, paired, dropped.

    Attributes:
        found: messages read per stream (role or topic name -> count).
        considered: primary frames looked at (all, or those kept by a replay rate).
        paired: frames that became observations.
        dropped: reason -> number of considered frames dropped for it.
        rate_hz: the replay rate, None for every frame.
    """

    found: dict[str, int] = field(default_factory=dict)
    considered: int = 0
    paired: int = 0
    dropped: Counter = field(default_factory=Counter)
    rate_hz: float | None = None

    def drop(self, reason: str) -> None:
        """Count one considered frame dropped for ``reason``."""
        self.dropped[reason] += 1

    def line(self) -> str:
        """One line for a report: "frames: 72 found, 72 considered, 70 paired, 2 dropped (...)"."""
        found = ", ".join(f"{n} {name}" for name, n in self.found.items())
        rate = "every frame" if self.rate_hz is None else f"at most {self.rate_hz:g} Hz"
        why = "; ".join(f"{n} {reason}" for reason, n in self.dropped.most_common())
        dropped = sum(self.dropped.values())
        return (f"frames: found {found}; {self.considered} primary frames considered ({rate}), "
                f"{self.paired} paired, {dropped} dropped" + (f" ({why})" if why else ""))

    def as_dict(self) -> dict:
        """JSON-ready copy."""
        return {"found": dict(self.found), "considered": self.considered, "paired": self.paired,
                "dropped": dict(self.dropped), "rate_hz": self.rate_hz, "line": self.line()}
