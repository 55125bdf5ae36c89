"""A screenshot of ``heisd-view --web`` on a bag, as headless Chromium draws it.

    python scripts/viewer_screenshot.py BAG OUT.png [--timeout-s 180]

Serves the bag with ``heisd-view bag BAG --web`` on free ports, opens the web viewer in
Debian's Chromium (SwiftShader WebGL) through Playwright, and keeps screenshotting until the
3-D view shows the EE path in at least three step-kind colours. Exit 1 when it never does.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    """Entry point."""
    from heisd_ros.testing.browser import colour_pixels, screenshot_when
    from heisd_ros.viewer.steps import KIND_COLOURS

    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bag")
    p.add_argument("out")
    p.add_argument("--timeout-s", type=float, default=180.0)
    p.add_argument("--settle-s", type=float, default=20.0,
                   help="once the path shows, wait this long for the rest to stream in")
    args = p.parse_args(argv)
    view_3d = (0.0, 0.06, 0.58, 0.94)   # the 3-D view's part of the window

    def drawn(png) -> bool:
        shown = [k for k, c in KIND_COLOURS.items() if colour_pixels(png, c, 40, view_3d) >= 15]
        return len(shown) >= 3

    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "view.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "heisd_ros.tools.view", "bag", args.bag, "--web",
                 "--web-port", str(_free_port()), "--grpc-port", str(_free_port()),
                 "--serve-s", str(args.timeout_s + 60)], stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120.0
            while "web viewer at" not in log.read_text():
                if proc.poll() is not None or time.monotonic() > deadline:
                    sys.stderr.write(log.read_text())
                    return 1
                time.sleep(0.2)
            url = log.read_text().split("web viewer at ")[1].split()[0]
            ok = screenshot_when(url, args.out, drawn, timeout_s=args.timeout_s,
                                 settle_s=args.settle_s)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    sys.stdout.write(f"{'wrote' if ok else 'path never drawn; last screenshot in'} {args.out}\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
