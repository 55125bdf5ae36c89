"""piper_sdk's log output, captured: counted and kept for the caller to report, never printed.

piper_sdk 0.6.x logs through the Python logger ``"PIPER"`` (``piper_sdk/utils/__init__.py``,
``utils/logger_mag.py``): a ``StreamHandler`` on stderr at the level of the newest
``C_PiperInterface_V2`` (WARNING by default), ``propagate = False``. Its CAN layer
(``hardware_port/can_encapsulation_v0_4_0.py``) swallows python-can errors and returns status
codes, and the interface logs one ERROR line per frame that did not go out
(``"EndPoseXY send failed: SendCanMessage(SEND_MESSAGE_FAILED (100016))"``): a driver holding
at 50 Hz on a dead bus printed about 200 lines (~40 KiB) a second, and every connection
attempt on a missing interface printed ``"CAN socket can0 does not exist."``.

:func:`capture_sdk_log` replaces that stderr handler by one :class:`SdkLogCapture` for the
process; the driver reports what it collected (a throttled summary line and a diagnostics
counter) instead.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter

#: The logger piper_sdk writes to.
SDK_LOGGER = "PIPER"

_install_lock = threading.Lock()
_capture: SdkLogCapture | None = None


class SdkLogCapture(logging.Handler):
    """Counts piper_sdk's log records (WARNING and up) and keeps the newest message.

    Thread-safe: the SDK logs from its reader thread and from whichever thread sends.
    """

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self._counts: Counter[str] = Counter()
        self._total = 0
        self._last = ""

    def emit(self, record: logging.LogRecord) -> None:
        """Count one record (never raises: a log call must not break a send)."""
        if getattr(record, "local_area", None) == "LOGGER":
            return  # the SDK's notes about its own logging set-up ("Log level update ...")
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a malformed format string in the SDK
            message = str(record.msg)
        with self.lock:
            self._total += 1
            self._counts[message] += 1
            self._last = message

    @property
    def total(self) -> int:
        """Records captured since the process started."""
        with self.lock:
            return self._total

    @property
    def last(self) -> str:
        """The newest captured message ("" before the first)."""
        with self.lock:
            return self._last

    def most_common(self, n: int = 3) -> list[tuple[str, int]]:
        """The ``n`` most frequent messages with their counts."""
        with self.lock:
            return self._counts.most_common(n)


def capture_sdk_log() -> SdkLogCapture:
    """Route piper_sdk's log records into the process's :class:`SdkLogCapture` (idempotent).

    Removes the SDK's own stderr handlers from the ``"PIPER"`` logger (a file handler the SDK
    was asked for stays) and attaches the capture. Call it before creating a
    ``C_PiperInterface_V2``; doing it again later is harmless.
    """
    global _capture
    try:  # the SDK adds its stderr handler when it is imported: be after that
        import piper_sdk  # noqa: F401
    except ImportError:
        pass
    with _install_lock:
        logger = logging.getLogger(SDK_LOGGER)
        if _capture is None:
            _capture = SdkLogCapture()
        for handler in list(logger.handlers):
            if isinstance(handler, logging.StreamHandler) and not isinstance(
                handler, logging.FileHandler
            ):
                logger.removeHandler(handler)
        if _capture not in logger.handlers:
            logger.addHandler(_capture)
        return _capture
