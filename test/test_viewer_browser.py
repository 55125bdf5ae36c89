"""heisd-view --web as a person sees it: headless Chromium draws the arm and the coloured path.

Needs Debian's Chromium (``apt-get install chromium``) and Playwright (test requirements);
skipped, saying which is missing, without them.
"""

from __future__ import annotations

import pytest

from heisd_ros.testing.browser import (
    VIEWER_3D_BOX,
    chromium_path,
    colour_pixels,
    screenshot_when,
    served_bag,
)
from heisd_ros.viewer.steps import KIND_COLOURS
from test.fixtures_viewer import KINDS, STEPS, bag_of
from test.node_process import repo_env

pytest.importorskip("rerun", reason="the view extra (rerun-sdk) is not installed")
pytest.importorskip("playwright", reason="playwright is not installed (requirements/test.txt)")
if chromium_path() is None:
    pytest.skip("Debian's chromium is not installed (apt-get install chromium)",
                allow_module_level=True)

#: Pixels of a kind's colour that count as that kind's part of the path being drawn.
MIN_PIXELS = 15


def test_the_web_viewer_draws_the_path_in_its_kinds_colours(tmp_path):
    _, bag = bag_of(tmp_path, STEPS * 3)
    shown = {k for k in set(KINDS) if k != "ar"}

    def counts(png) -> dict[str, int]:
        return {k: colour_pixels(png, KIND_COLOURS[k], 40, VIEWER_3D_BOX) for k in shown}

    png = tmp_path / "viewer.png"
    with served_bag(bag, tmp_path / "view.log", env=repo_env()) as url:
        ok = screenshot_when(url, png, lambda p: min(counts(p).values()) >= MIN_PIXELS,
                             timeout_s=180.0)
    assert ok, f"path colours in the screenshot {png}: {counts(png)}"
