"""A page as a person sees it: headless Chromium (Debian's) driven by Playwright, screenshots.

Used by the web viewer's browser test and ``scripts/viewer_screenshot.py``, which serve a bag
with :func:`served_bag` and look at it with :func:`screenshot_when`. Chromium renders
WebGL with SwiftShader (software), which is what makes Rerun's web viewer draw on a machine
without a GPU. The flags keep Chromium off the network (this machine's is closed) and out of
a sandbox it cannot have as root.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

#: The part of the window ``heisd-view``'s 3-D view takes (heisd_ros.viewer.episode_log's
#: blueprint: the left 3/5, below the top bar, above the time panel), as :func:`colour_pixels`'
#: box; the cameras' own colours stay out of it.
VIEWER_3D_BOX = (0.0, 0.06, 0.58, 0.94)
CHROMIUM_ARGS = ("--no-sandbox", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--use-angle=swiftshader", "--enable-unsafe-swiftshader",
                 "--ignore-gpu-blocklist")


def chromium_path() -> str | None:
    """Debian's Chromium (``apt-get install chromium``), or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def colour_pixels(png: str | Path, rgb: tuple[int, int, int], tolerance: int = 30,
                  box: tuple[float, float, float, float] = (0.0, 0.0, 1.0, 1.0)) -> int:
    """Pixels within ``tolerance`` (per channel) of ``rgb`` in ``box`` of the image.

    ``box``: (left, top, right, bottom) as fractions of the width and height.
    """
    import matplotlib.image

    image = matplotlib.image.imread(str(png))[..., :3]
    h, w = image.shape[:2]
    image = image[int(box[1] * h):int(box[3] * h), int(box[0] * w):int(box[2] * w)]
    pixels = np.round(image * 255).astype(int) if image.dtype.kind == "f" else image
    return int(np.all(np.abs(pixels - np.asarray(rgb)) <= tolerance, axis=-1).sum())


def screenshot_when(url: str, out: str | Path, ready: Callable[[Path], bool],
                    timeout_s: float = 120.0, size_px: tuple[int, int] = (1400, 900),
                    poll_s: float = 2.0, settle_s: float = 0.0) -> bool:
    """Open ``url``; screenshot to ``out`` every ``poll_s`` until ``ready(out)`` or timeout.

    ``settle_s``: once ready, wait this long and take the screenshot again (a page still
    streaming in). Returns whether ``ready`` held (the last screenshot is left in ``out``).
    """
    from playwright.sync_api import sync_playwright

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), headless=True,
                                    args=list(CHROMIUM_ARGS))
        try:
            page = browser.new_page(viewport={"width": size_px[0], "height": size_px[1]})
            page.goto(url)
            deadline = time.monotonic() + timeout_s
            while True:
                page.screenshot(path=str(out))
                if ready(out):
                    if settle_s > 0:
                        page.wait_for_timeout(settle_s * 1e3)
                        page.screenshot(path=str(out))
                    return True
                if time.monotonic() >= deadline:
                    return False
                page.wait_for_timeout(poll_s * 1e3)
        finally:
            browser.close()


def free_port() -> int:
    """A TCP port free on localhost now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def served_bag(bag: str | Path, log: Path, serve_s: float = 300.0, env: dict | None = None,
               ready_timeout_s: float = 120.0) -> Iterator[str]:
    """``heisd-view bag BAG --web`` on free ports; yields the web viewer's address.

    Its output goes to ``log``; RuntimeError (with that output) when it exits or prints no
    address within ``ready_timeout_s``. Stopped on leaving the block.
    """
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "heisd_ros.tools.view", "bag", str(bag), "--web",
             "--web-port", str(free_port()), "--grpc-port", str(free_port()),
             "--serve-s", str(serve_s)], stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + ready_timeout_s
        while "web viewer at" not in log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"heisd-view served no web viewer:\n{log.read_text()}")
            time.sleep(0.2)   # polling a child's log file
        yield log.read_text().split("web viewer at ")[1].split()[0]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
