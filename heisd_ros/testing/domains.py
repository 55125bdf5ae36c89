"""ROS_DOMAIN_IDs that no other live process on this machine holds.

A test or a measurement tool that starts a ROS 2 graph needs a DDS domain of its own: two
graphs on one domain see each other's topics. :func:`allocate_domain` returns such an id and
holds it for the rest of the process (or until :func:`release_domain`): it takes an exclusive,
non-blocking ``flock`` on ``<tempdir>/heisd_ros_domains/<id>.lock`` and keeps the file open. The
kernel drops the lock when the process ends, however it ends, so a crashed process never
leaves an id taken. Every allocator on the machine must use this module (and the same
``TMPDIR``) for the promise to hold.

Only the process that allocates holds the lock: node programs it starts get the id through
``ROS_DOMAIN_ID`` and must not allocate one themselves. The lock covers this machine only;
DDS discovery can still reach other machines on the network on the same domain.

The ids come from :data:`DOMAIN_IDS`: 1..101 and 215..232, the ranges whose default Fast DDS
ports stay clear of Linux's ephemeral ports (32768..60999). 0 is left out (every ROS 2 node
without ``ROS_DOMAIN_ID`` uses it), and so is this process's own ``ROS_DOMAIN_ID``. Each
process starts its scan at an offset derived from its pid and moves on after each id it takes,
so parallel processes rarely try the same id and a released id is not handed out again at
once by the same process.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

#: Every id the allocator hands out, in scan order.
DOMAIN_IDS: tuple[int, ...] = tuple(range(1, 102)) + tuple(range(215, 233))

_lock = threading.Lock()
_held: dict[int, int] = {}  # domain id -> file descriptor holding its lock
_cursor: int | None = None  # index into DOMAIN_IDS where the next scan starts


def lock_dir() -> Path:
    """The directory of the per-id lock files, shared by every process on this machine."""
    return Path(tempfile.gettempdir()) / "heisd_ros_domains"


def _open_lock_dir() -> Path:
    path = lock_dir()
    if not path.is_dir():
        path.mkdir(exist_ok=True)
        with contextlib.suppress(OSError):  # other users' processes must create files here
            path.chmod(0o1777)
    return path


def _try_lock(path: Path) -> int | None:
    """A descriptor holding an exclusive lock on ``path``, or None when another holds it."""
    # Read-only is enough for flock, and opens a file another user created.
    fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _excluded() -> set[int]:
    own = os.environ.get("ROS_DOMAIN_ID", "").strip()
    return {int(own)} if own.isdigit() else set()


def allocate_domain() -> int:
    """A ROS_DOMAIN_ID that no other process on this machine holds; held until released.

    Successive calls in one process return different ids. The id stays held until
    :func:`release_domain` or the end of the process.

    Raises:
        RuntimeError: every id of :data:`DOMAIN_IDS` is held.
    """
    global _cursor
    with _lock:
        directory = _open_lock_dir()
        if _cursor is None:
            _cursor = os.getpid() % len(DOMAIN_IDS)
        excluded = _excluded()
        for step in range(len(DOMAIN_IDS)):
            index = (_cursor + step) % len(DOMAIN_IDS)
            domain = DOMAIN_IDS[index]
            if domain in _held or domain in excluded:
                continue
            fd = _try_lock(directory / f"{domain}.lock")
            if fd is not None:
                _held[domain] = fd
                _cursor = index + 1
                return domain
        raise RuntimeError(
            f"no free ROS_DOMAIN_ID: all {len(DOMAIN_IDS)} are held by processes on this "
            f"machine (locks in {directory}); this process holds {sorted(_held)}")


def release_domain(domain: int) -> None:
    """Give ``domain`` back for any process to take; nodes on it should be stopped first.

    Raises:
        ValueError: this process does not hold ``domain``.
    """
    with _lock:
        fd = _held.pop(domain, None)
    if fd is None:
        raise ValueError(f"ROS_DOMAIN_ID {domain} is not held by this process")
    os.close(fd)  # the only descriptor of the lock's open file: closing it unlocks


def held_domains() -> list[int]:
    """The ids this process holds, in ascending order."""
    with _lock:
        return sorted(_held)


@contextlib.contextmanager
def reserved_domain() -> Iterator[int]:
    """:func:`allocate_domain` for the ``with`` block; released when it ends."""
    domain = allocate_domain()
    try:
        yield domain
    finally:
        release_domain(domain)


def _forget_after_fork() -> None:
    """A forked child holds nothing: it closes its copies of the parent's descriptors.

    Closing a copy leaves the parent's lock in place (the lock belongs to the open file,
    which the parent still has open); unlocking it would release the parent's id.
    """
    global _cursor, _lock
    _lock = threading.Lock()  # another thread may have held it at the fork
    for fd in _held.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()
    _cursor = None


os.register_at_fork(after_in_child=_forget_after_fork)
