"""A page as a person sees it: headless Chromium (Debian's) driven by Playwright, screenshots.

Used by the web viewer's browser test and ``scripts/viewer_screenshot.py``. Chromium renders
WebGL with SwiftShader (software), which is what makes Rerun's web viewer draw on a machine
without a GPU. The flags keep Chromium off the network (this machine's is closed) and out of
a sandbox it cannot have as root.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

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
