"""A screenshot of ``heisd-view --web`` on a bag, as headless Chromium draws it.

    python scripts/viewer_screenshot.py BAG OUT.png [--timeout-s 180]

Serves the bag with ``heisd-view bag BAG --web`` on free ports, opens the web viewer in
Debian's Chromium (SwiftShader WebGL) through Playwright, and keeps screenshotting until the
3-D view shows the EE path in at least three step-kind colours. Exit 1 when it never does.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path


def main(argv=None) -> int:
    """Entry point."""
    from heisd_ros.testing.browser import (
        VIEWER_3D_BOX,
        colour_pixels,
        screenshot_when,
        served_bag,
    )
    from heisd_ros.viewer.steps import KIND_COLOURS

    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bag")
    p.add_argument("out")
    p.add_argument("--timeout-s", type=float, default=180.0)
    p.add_argument("--settle-s", type=float, default=20.0,
                   help="once the path shows, wait this long for the rest to stream in")
    args = p.parse_args(argv)

    def drawn(png) -> bool:
        shown = [k for k, c in KIND_COLOURS.items()
                 if colour_pixels(png, c, 40, VIEWER_3D_BOX) >= 15]
        return len(shown) >= 3

    with tempfile.TemporaryDirectory() as tmp:
        try:
            with served_bag(args.bag, Path(tmp) / "view.log",
                            serve_s=args.timeout_s + args.settle_s + 60) as url:
                ok = screenshot_when(url, args.out, drawn, timeout_s=args.timeout_s,
                                     settle_s=args.settle_s)
        except RuntimeError as err:
            sys.stderr.write(f"{err}\n")
            return 1
    sys.stdout.write(f"{'wrote' if ok else 'path never drawn; last screenshot in'} {args.out}\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
