"""heisd-view --web as a person sees it: headless Chromium draws the arm and the coloured path.

Needs Debian's Chromium (``apt-get install chromium``) and Playwright (test requirements);
skipped, saying which is missing, without them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from heisd_ros.testing.browser import chromium_path, colour_pixels, screenshot_when
from heisd_ros.viewer.steps import KIND_COLOURS
from test.fixtures_viewer import KINDS, STEPS, bag_of
from test.node_process import repo_env
from test.polling import wait_until

pytest.importorskip("rerun", reason="the view extra (rerun-sdk) is not installed")
pytest.importorskip("playwright", reason="playwright is not installed (requirements/test.txt)")
if chromium_path() is None:
    pytest.skip("Debian's chromium is not installed (apt-get install chromium)",
                allow_module_level=True)

#: Pixels of a kind's colour that count as that kind's part of the path being drawn.
MIN_PIXELS = 15
#: The 3-D view's part of the window (heisd_ros.viewer.episode_log.blueprint: the left 3/5,
#: below the top bar, above the time panel): the cameras' own colours stay out.
VIEW_3D = (0.0, 0.06, 0.58, 0.94)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_web_viewer_draws_the_path_in_its_kinds_colours(tmp_path):
    _, bag = bag_of(tmp_path, STEPS * 3)
    web, grpc = _free_port(), _free_port()
    log = tmp_path / "view.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "heisd_ros.tools.view", "bag", str(bag), "--web",
             "--web-port", str(web), "--grpc-port", str(grpc), "--serve-s", "300"],
            stdout=out, stderr=subprocess.STDOUT, env=repo_env(), cwd=os.getcwd())
    try:
        assert wait_until(lambda: "web viewer at" in log.read_text() or proc.poll() is not None,
                          120.0), log.read_text()
        assert proc.poll() is None, log.read_text()
        url = log.read_text().split("web viewer at ")[1].split()[0]
        shown = {k for k in set(KINDS) if k != "ar"}

        def drawn(png) -> bool:
            return all(colour_pixels(png, KIND_COLOURS[k], 40, VIEW_3D) >= MIN_PIXELS
                       for k in shown)

        png = tmp_path / "viewer.png"
        ok = screenshot_when(url, png, drawn, timeout_s=180.0)
        counts = {k: colour_pixels(png, KIND_COLOURS[k], 40, VIEW_3D) for k in shown}
        assert ok, f"path colours in the screenshot {png}: {counts}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
