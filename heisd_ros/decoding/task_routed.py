"""A router method whose router statistics follow the task: one decoder per statistics file.

Router statistics belong to a task suite, and the task arrives with the episode (or the
observation), so a long-running process (the policy node) chooses the decoder per task: one
``HybridDecoder`` per statistics file (each keeps its own online skip threshold), and a
drafter-SD stand-in when no statistics resolve, whose steps all carry the reason in their
status (``HybridStep.status``). Which file a task gets is the caller's ``resolve``
(``heisd_ros.decoder_loader.resolve_router_stats``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from heisd_ros.decoding.interface import ActionResult, Decoder
from heisd_ros.decoding.retrieval_source import task_of


@dataclass(frozen=True)
class Resolved:
    """A file a decoder uses (None: none) and where it came from, or why there is none."""

    path: str | None
    note: str
    explicit: bool = False


class TaskRoutedDecoder(Decoder):
    """A router method (``router_only``, ``router_skip``, ``heisd``, ...) routed per task.

    Attributes:
        method: the router method asked for.
        current: the decoder in use (None before the first task).
        degraded: "" while routing; else why this runs as drafter SD.
        description: what runs and with which files (for logs and diagnostics).
    """

    def __init__(self, method: str, make: Callable[[str | None], Decoder],
                 resolve: Callable[[str], Resolved], warn: Callable[[str], None],
                 details: str = "") -> None:
        """Route per task.

        Args:
            method: the router method.
            make: ``make(stats_path or None)`` builds its decoder (None: drafter SD).
            resolve: ``resolve(task)`` finds the task's router statistics.
            warn: gets each new reason to run as drafter SD.
            details: the draft head and calibration, for :attr:`description`.
        """
        self.method = method
        self._make, self._resolve, self._warn = make, resolve, warn
        self._details = details
        self._decoders: dict[str | None, Decoder] = {}
        self._resolved: dict[str, Resolved] = {}
        self._warned: set[str] = set()
        self._task: str | None = None
        self.current: Decoder | None = None
        self.degraded = ""
        self.description = f"{method}: router statistics per task (none chosen yet); {details}"

    def select(self, task: str | None) -> bool:
        """Use the decoder for ``task``'s router statistics; True when that changed it.

        Raises:
            OSError, ValueError: explicit router statistics that do not load.
        """
        key = task or ""
        res = self._resolved.get(key)
        if res is None:
            res = self._resolved[key] = self._resolve(key)
        decoder = self._decoders.get(res.path)
        if decoder is None:
            try:
                decoder = self._make(res.path)
            except (OSError, ValueError, KeyError) as exc:
                if res.explicit or res.path is None:
                    raise
                res = self._resolved[key] = Resolved(
                    None, f"router statistics {res.path} do not load ({exc})")
                decoder = self._decoders.get(None) or self._make(None)
            self._decoders[res.path] = decoder
        if res.path is None:
            self.degraded = f"{self.method} runs as drafter SD: {res.note}"
            self.description = f"{self.degraded}; {self._details}"
            if self.degraded not in self._warned:
                self._warned.add(self.degraded)
                self._warn(self.degraded)
        else:
            self.degraded = ""
            self.description = (f"{self.method}: router statistics {res.path} ({res.note}); "
                                f"{self._details}")
        changed, self.current = decoder is not self.current, decoder
        return changed

    def begin_episode(self, task: str | None = None) -> None:
        """New episode of ``task`` (None: the observations' task): reset, pick its decoder."""
        self._task = task
        if task:
            self.select(task)
        for decoder in self._decoders.values():
            decoder.begin_episode(task)

    def episode_end(self, success: bool) -> float | None:
        """Adapt the verify-skip threshold of the decoder that ran the episode."""
        return self.current.episode_end(success) if self.current is not None else None

    def collect_check(self):
        """The pending check behind of the decoder in use, if any."""
        return self.current.collect_check() if self.current is not None else None

    def decode(self, observation) -> ActionResult:
        """Decode one action with the decoder of the observation's task."""
        if self.select(self._task or task_of(observation)):
            self.current.begin_episode(self._task)  # it was idle: start it fresh
        result = self.current.decode(observation)
        if self.degraded:  # every step says why it is not routed
            own = result.record.status
            result.record.status = f"{self.degraded}; {own}" if own else self.degraded
        return result
