"""When the policy node holds, and how it says why, without ROS.

The node sends no command for input it cannot trust, and every hold names its rule:

- the input gate (:mod:`heisd_ros.nodes.policy_inputs`) refuses stale or malformed frames,
  frames from the future, mismatched image sizes and NaN in the robot state;
- a command whose frames are older than ``max_command_age_s`` when the decoder is done is
  not sent ("stale command", :func:`stale_command`);
- when nothing happens for ``input_timeout_s`` (no command, no refusal) the node names what it
  waits for: a silent or never-heard input topic, or the instruction ("waiting for input",
  :meth:`HoldPolicy.waiting_for`).

:class:`HoldPolicy` counts the refusals by kind (the text before the first ':'), warns once
per kind and ``warn_throttle_s``, keeps the live problem until the next command is sent
(``last_problem``) and the last reason ever given (``last_refusal``), and says once when this
machine decodes too slowly for the command-age limit (``too_slow_warning``).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from heisd_ros.nodes.policy_config import PolicyNodeConfig
    from heisd_ros.nodes.policy_diagnostics import StepLatency

#: Decoded steps before the node judges whether this machine is too slow for its limit.
TOO_SLOW_MIN_STEPS = 10


def stale_command(age_s: float, limit_s: float, decode_ms: float) -> str:
    """Why a command whose frames were ``age_s`` old when it was ready is held; "" to send it.

    NaN-safe: an unknown age is too old.
    """
    if age_s <= limit_s:
        return ""
    return (f"stale command: its frames were {age_s:.3f} s old when the action was ready "
            f"(max_command_age_s {limit_s} s; decode took {decode_ms:.0f} ms); not sent")


def too_slow_warning(decode_ms: float, limit_s: float) -> str:
    """What to do when a step alone (median ``decode_ms``) takes longer than ``limit_s``."""
    return (f"this machine decodes too slowly for the command-age limit: a step takes "
            f"{decode_ms:.0f} ms (median of the last {TOO_SLOW_MIN_STEPS} or more), more than "
            f"max_command_age_s = {limit_s} s, so most commands will be held as stale. "
            f"Run the VLA on a GPU (model.device), feed smaller camera images, or, if the "
            f"task tolerates older commands, raise max_command_age_s (and the driver's "
            f"controller.max_command_age_s)")


class HoldPolicy:
    """Refusals, the live problem and silent inputs of one policy (module docstring).

    Reads ``warn_throttle_s``, ``input_timeout_s`` and ``max_command_age_s`` from ``config``
    at each use, so a changed setting counts from then on.

    Attributes:
        refusals: refusals by kind.
        last_problem: the live problem; cleared by the next command sent.
        last_refusal: the last reason ever given.
        too_slow_warning: said once, then kept ("" until then).
    """

    def __init__(self, config: PolicyNodeConfig, clock: Callable[[], float],
                 warn: Callable[[str], None],
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        """Track holds against ``clock`` (the node's, s); warnings go to ``warn``.

        ``monotonic`` (s) times the warning throttle, which wall time must not stretch.
        """
        self.config = config
        self.refusals: Counter[str] = Counter()
        self.last_problem = ""
        self.last_refusal = ""
        self.too_slow_warning = ""
        self._clock = clock
        self._warn = warn
        self._monotonic = monotonic
        self._last_activity_s = clock()  # the last command or refusal; start counts as one
        self._heard: dict[str, float] = {}  # input -> clock of its last message, s
        self._warned_at: dict[str, float] = {}  # kind -> monotonic time of its last warning

    def heard(self, name: str, now_s: float) -> None:
        """Input ``name`` sent a message at ``now_s`` (the clock's time)."""
        self._heard[name] = now_s

    def refuse(self, kind: str, problem: str) -> None:
        """Count and (throttled per kind) warn; nothing is sent for this input."""
        self.last_problem = self.last_refusal = problem
        self._last_activity_s = self._clock()
        self.refusals[kind] += 1  # last: readers that wait on the count see the reason
        now = self._monotonic()
        if now - self._warned_at.get(kind, -math.inf) >= self.config.warn_throttle_s:
            self._warned_at[kind] = now
            self._warn(f"holding, no command: {problem}")

    def sent(self) -> None:
        """A command went out: nothing holds the robot now."""
        self.last_problem = ""
        self._last_activity_s = self._clock()

    def check_speed(self, latency: StepLatency) -> None:
        """Say once when the median step time alone exceeds ``max_command_age_s``."""
        if self.too_slow_warning:
            return
        decode_ms = latency.decode_p50_ms(min_steps=TOO_SLOW_MIN_STEPS)
        limit_s = self.config.max_command_age_s
        if decode_ms is None or decode_ms <= limit_s * 1e3:
            return
        self.too_slow_warning = too_slow_warning(decode_ms, limit_s)
        self._warn(self.too_slow_warning)

    def waiting_for(self, now_s: float, topics: dict[str, str], instruction: str = "") -> str:
        """What the policy waits for when it has done nothing for ``input_timeout_s``, or "".

        Args:
            now_s: the clock's time, s.
            topics: input name (as given to :meth:`heard`) -> the topic named for it.
            instruction: how to give the missing instruction; "" when there is one.

        Returns:
            "waiting for input: " and each input that never sent or has been silent that long,
            and the instruction; "" while steps run or refusals already say why.
        """
        timeout_s = self.config.input_timeout_s
        if now_s - self._last_activity_s <= timeout_s:
            return ""
        missing = []
        for name, topic in topics.items():
            heard = self._heard.get(name)
            if heard is None:
                missing.append(f"{topic} (nothing received yet)")
            elif now_s - heard > timeout_s:
                missing.append(f"{topic} (silent for {now_s - heard:.1f} s)")
        if instruction:
            missing.append(instruction)
        if not missing:
            return ""
        return "waiting for input: " + "; ".join(missing)
