"""Lint as a test: ruff (pycodestyle, pyflakes, bugbear, isort, pep257-style docstrings)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PATHS = ("heisd_ros", "test", "launch", "scripts", "setup.py")


def test_ruff_is_clean():
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (scripts/setup.sh installs it)")
    paths = [p for p in PATHS if (ROOT / p).exists()]
    result = subprocess.run([ruff, "check", "--no-cache", *paths],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
