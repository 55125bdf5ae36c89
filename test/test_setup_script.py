"""scripts/setup.sh says what is wrong with a bad environment, and how to fix it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETUP = ROOT / "scripts" / "setup.sh"
TOOLS = ("dirname", "date", "sha256sum", "cut", "cat", "printf")


def _run(tmp_path: Path, python: str, with_compiler: bool) -> subprocess.CompletedProcess:
    """Run ``setup.sh --check`` with a PATH holding only the named tools."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in TOOLS + (("cc", "c++") if with_compiler else ()):
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path), "HEISD_PYTHON": python}
    bash = shutil.which("bash")
    return subprocess.run([bash, str(SETUP), "--check"], capture_output=True, text=True,
                          env=env, timeout=120)


def _fake_python(tmp_path: Path, version: str) -> str:
    fake = tmp_path / f"python{version}"
    fake.write_text(f"#!{shutil.which('bash')}\necho {version}\n")
    fake.chmod(0o755)
    return str(fake)


def test_wrong_python_version_is_named_with_a_fix(tmp_path):
    result = _run(tmp_path, _fake_python(tmp_path, "3.9"), with_compiler=True)
    assert result.returncode != 0
    assert "needs CPython 3.11" in result.stderr and "is Python 3.9" in result.stderr
    assert "fix:" in result.stderr


def test_missing_interpreter_is_named(tmp_path):
    result = _run(tmp_path, str(tmp_path / "no-such-python"), with_compiler=True)
    assert result.returncode != 0
    assert "no Python interpreter found" in result.stderr


def test_missing_compiler_is_named_with_a_fix(tmp_path):
    result = _run(tmp_path, sys.executable, with_compiler=False)
    assert result.returncode != 0
    assert "no C/C++ compiler" in result.stderr
    assert "build-essential" in result.stderr


def test_a_good_environment_passes_the_check(tmp_path):
    result = _run(tmp_path, sys.executable, with_compiler=True)
    assert result.returncode == 0, result.stderr
    assert "environment OK" in result.stdout


def test_venv_inside_the_repository_is_refused(tmp_path):
    env = dict(os.environ, HEISD_VENV=str(ROOT / ".venv"))
    result = subprocess.run(["bash", str(SETUP), "--check"], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.returncode != 0
    assert "lies inside the repository" in result.stderr
