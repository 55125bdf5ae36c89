"""Where a recording goes: a ``.rrd`` file, Rerun's web viewer, or the native viewer.

- ``save``: the recording is written to a file (read it with ``rerun FILE.rrd`` or
  :func:`heisd_ros.viewer.readback.entity_rows`);
- ``web``: a gRPC server holds the recording and Rerun's web viewer is served on localhost;
  the address to open is printed;
- ``native``: the native viewer is spawned (a process of its own). It needs a display: without
  one (no ``DISPLAY``/``WAYLAND_DISPLAY`` on Linux) the web viewer is served instead, and the
  tool says so.
"""

from __future__ import annotations

import os
import sys
import uuid
from dataclasses import dataclass

from heisd_ros.viewer import require_rerun
from heisd_ros.viewer.episode_log import blueprint

APPLICATION_ID = "heisd_ros"
#: Served recordings: a RecordingStream's gRPC server stops when the stream is collected.
_SERVED: list = []


@dataclass(frozen=True)
class Output:
    """Where to send a recording: ``save`` path, ``web`` serving, or the native viewer."""

    save: str | None = None
    web: bool = False
    web_port: int = 9090
    grpc_port: int = 9876

    def __post_init__(self) -> None:
        for name in ("web_port", "grpc_port"):
            port = getattr(self, name)
            if not 0 < port < 65536:
                raise ValueError(f"{name}: expected a TCP port 1..65535, got {port}")


def has_display() -> bool:
    """Whether a native window can open here (always assumed off Linux)."""
    if not sys.platform.startswith("linux"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def web_viewer_url(web_port: int, grpc_url: str) -> str:
    """The address of the served web viewer connected to ``grpc_url``."""
    from urllib.parse import quote

    return f"http://127.0.0.1:{web_port}/?url={quote(grpc_url, safe=':/')}"


def open_recording(output: Output, name: str, say=print):
    """A new ``RecordingStream`` named ``name`` sending where ``output`` says.

    Returns (recording, web address or None). The web viewer and the gRPC server live as
    long as this process.
    """
    rr = require_rerun()
    recording = rr.RecordingStream(APPLICATION_ID, recording_id=str(uuid.uuid4()))
    recording.send_recording_name(name)
    layout = blueprint()
    if output.save:
        recording.save(output.save, default_blueprint=layout)
        return recording, None
    web = output.web
    if not web and not has_display():
        say("heisd-view: no display here (DISPLAY unset): serving the web viewer instead")
        web = True
    if not web:
        recording.spawn(default_blueprint=layout, port=output.grpc_port)
        return recording, None
    grpc_url = recording.serve_grpc(grpc_port=output.grpc_port, default_blueprint=layout)
    _SERVED.append(recording)
    rr.serve_web_viewer(web_port=output.web_port, open_browser=False, connect_to=grpc_url)
    url = web_viewer_url(output.web_port, grpc_url)
    say(f"heisd-view: web viewer at {url}")
    return recording, url
