"""Is a command fresh, and does it continue the stream? Step-index continuity and stamp age.

Two pure rules the controller applies before a command may move the arm:

- :func:`classify_step`: where a command's ``step_index`` sits relative to the last one seen.
  A delta is relative to the pose the previous deltas built; when commands are lost in
  transport (a jump forward by more than 1) the sum of the rest is a partial stream, and a
  step index that goes backwards is a sender that started over (a new run or episode).
- :func:`stamp_problem`: ``EECommand.header.stamp`` is the time of the observation the action
  was decided on; a command decided on an old (or future, or absent) observation is refused.

No clock and no I/O: callers pass the times.
"""

from __future__ import annotations

import enum


class StepEvent(str, enum.Enum):
    """How a command's step_index relates to the last one seen (values go into messages)."""

    FIRST = "first"  # nothing seen since start / re-sync
    NEXT = "next"  # last + 1
    DUPLICATE = "duplicate"  # == last: a re-delivery
    GAP = "gap"  # > last + 1: commands lost in transport
    RESTART = "restart"  # < last: the sender started a new stream


def classify_step(last: int | None, step: int) -> tuple[StepEvent, int]:
    """Classify ``step`` after ``last`` (None: nothing seen yet).

    Returns:
        (event, lost): ``lost`` is the number of step indices skipped (> 0 only for a gap).
    """
    if last is None:
        return StepEvent.FIRST, 0
    if step == last + 1:
        return StepEvent.NEXT, 0
    if step == last:
        return StepEvent.DUPLICATE, 0
    if step > last:
        return StepEvent.GAP, step - last - 1
    return StepEvent.RESTART, 0


def stamp_problem(stamp_s: float, clock_s: float, max_age_s: float, max_future_s: float) -> str:
    """Why a command stamped ``stamp_s`` must not run at ``clock_s`` ("" when it may).

    A zero stamp is a command without a stamp (``header.stamp`` left at 0): its age is
    unknown, so it is refused like a stale one.

    Args:
        stamp_s: the command's stamp (the observation it was decided on), s.
        clock_s: now, on the clock the stamps are taken from (the node's ROS clock), s.
        max_age_s: oldest accepted observation, s.
        max_future_s: tolerated clock skew: a stamp at most this far ahead of ``clock_s``, s.
    """
    if stamp_s == 0.0:
        return (
            "command has no stamp (header.stamp is 0): stamp it with the time of the "
            "observation it was decided on"
        )
    age = clock_s - stamp_s
    if age > max_age_s:
        return f"stale command: decided on an observation {age:.3f} s old (limit {max_age_s} s)"
    if -age > max_future_s:
        return (
            f"command stamped {-age:.3f} s in the future (limit {max_future_s} s): "
            "the sender's clock is ahead of the driver's"
        )
    return ""
