"""What ``heisd-bench soak`` reads of its node processes: /proc samples and their logs.

Linux only: RSS is ``VmRSS`` of ``/proc/<pid>/status``, CPU time ``utime + stime`` of
``/proc/<pid>/stat`` (clock ticks, ``SC_CLK_TCK``), a process's children are the processes
whose parent pid (``/proc/<pid>/stat``) it is. psutil is not needed.
"""

from __future__ import annotations

import os
from pathlib import Path

_CLK_TCK = os.sysconf("SC_CLK_TCK")
#: Bytes of a log read at once while counting lines (bounds the tool's memory).
_CHUNK = 1 << 20


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat from the state on (field 3), None when gone.

    The command name (field 2) sits in parentheses and may hold spaces: split after it.
    """
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def read_proc(pid: int) -> tuple[int, float] | None:
    """(VmRSS KiB, utime + stime s) of a live process; None when gone or a zombie."""
    fields = _stat_fields(pid)
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    rss = [line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")]
    if fields is None or not rss:  # a zombie has no VmRSS
        return None
    return int(rss[0]), (int(fields[11]) + int(fields[12])) / _CLK_TCK


def children_of() -> dict[int, list[int]]:
    """Every process's children by parent pid (one pass over /proc)."""
    out: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (fields := _stat_fields(int(entry.name))) is not None:
            out.setdefault(int(fields[1]), []).append(int(entry.name))
    return out


def process_label(pid: int) -> str:
    """The module of ``python -m <module>`` (its last part), else the command name."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return str(pid)
    if b"-m" in args[:-1]:
        return args[args.index(b"-m") + 1].decode(errors="replace").rsplit(".", 1)[-1]
    return Path(args[0].decode(errors="replace")).name or str(pid)


class ProcessSampler:
    """RSS and CPU time of named processes and of every process they started.

    A started process is named ``<parent name>/<its label>`` (:func:`process_label`; a second
    one of the same label gets ``#2``). One that is gone without a successor of its name is an
    event (:meth:`take_events`); one back under another pid, a restart the samples show.
    """

    def __init__(self, roots: dict[str, int]) -> None:
        """``roots``: the named processes' pids."""
        self.roots = dict(roots)
        self._pids: dict[str, int] = {}
        self._events: list[str] = []

    def pids(self) -> dict[str, int]:
        """Every process to sample by name: the roots, then their descendants."""
        tree = children_of()
        out: dict[str, int] = {}
        for name, root in self.roots.items():
            out[name] = root
            todo = [(name, pid) for pid in sorted(tree.get(root, ()))]
            while todo:
                parent, pid = todo.pop(0)
                label, n = f"{parent}/{process_label(pid)}", 2
                while label in out:
                    label, n = f"{parent}/{process_label(pid)}#{n}", n + 1
                out[label] = pid
                todo += [(label, child) for child in sorted(tree.get(pid, ()))]
        return out

    def sample(self, now_s: float) -> dict[str, tuple[float, int, int, float]]:
        """Per live process ``(now_s, pid, VmRSS KiB, CPU s)``; a gone descendant is an event."""
        out = {}
        for name, pid in self.pids().items():
            if (proc := read_proc(pid)) is not None:
                out[name] = (now_s, pid, proc[0], proc[1])
        for name, pid in self._pids.items():
            if name not in out and name not in self.roots:  # roots: the caller names exits
                self._events.append(f"{name} (pid {pid}) is gone")
        self._pids = {name: s[1] for name, s in out.items()}
        return out

    def take_events(self) -> list[str]:
        """The events since the last call."""
        events, self._events = self._events, []
        return events


class LogScanner:
    """Counts lines with a needle in logs that grow, reading each byte once."""

    def __init__(self, logs: dict[str, Path]) -> None:
        """``logs``: log file by name."""
        self.logs = dict(logs)
        self._offsets = dict.fromkeys(self.logs, 0)

    def count(self, needle: str) -> dict[str, int]:
        """Per log, the complete lines written since the last call that contain ``needle``."""
        key = needle.encode()
        out = {}
        for name, path in self.logs.items():
            n = 0
            try:
                with open(path, "rb") as f:
                    f.seek(self._offsets[name])
                    while chunk := f.read(_CHUNK):
                        whole = chunk[:chunk.rfind(b"\n") + 1]  # a line still being written waits
                        n += sum(key in line for line in whole.splitlines())
                        self._offsets[name] += len(whole)
                        if len(whole) < len(chunk):
                            f.seek(self._offsets[name])
                            if not whole:
                                break
            except OSError:  # not written yet (or removed): nothing new in it
                pass
            out[name] = n
        return out
