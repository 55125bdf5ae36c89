"""Write the PIPER's URDF, generated from the project's kinematic table, to ``urdf/piper.urdf``.

    python scripts/write_piper_urdf.py            # regenerate the committed file
    python scripts/write_piper_urdf.py out.urdf   # write it elsewhere

``test/test_piper_urdf.py`` fails when the committed file differs from the generated text.
"""

from __future__ import annotations

import sys
from pathlib import Path

from heisd_ros.robot.piper_urdf import piper_urdf

DEFAULT_PATH = Path(__file__).resolve().parents[1] / "urdf" / "piper.urdf"


def main(argv: list[str] | None = None) -> int:
    """Write the URDF to the path given (default ``urdf/piper.urdf``) and say where."""
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else DEFAULT_PATH
    path.write_text(piper_urdf())
    sys.stdout.write(f"wrote {path}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
