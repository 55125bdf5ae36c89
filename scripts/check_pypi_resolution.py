"""The requirement set scripts/setup.sh installs resolves on plain PyPI, as users see it.

A machine that carries local wheels (a CPU build of torch in a find-links folder, an extra
index on disk) can resolve a set that PyPI alone cannot: a pin that fights torch's own pins
then passes here and fails at a user's first command. This check resolves the exact set with
``pip install --dry-run --ignore-installed`` and no pip configuration at all (``--isolated``,
``PIP_CONFIG_FILE=/dev/null``, no ``PIP_*`` variables), and fails when

- pip cannot resolve it (the conflict is printed as pip states it),
- anything would come from anywhere but the package indexes named here (no file:// wheels),
- the triton pinned for CPU builds of torch is not the one torch's PyPI build requires.

Two variants: torch as PyPI serves it (on Linux the CUDA build, which brings triton), and a
CPU build, from PyTorch's CPU index when it answers, else from a local CPU wheel of the same
version when pip's configuration names one (said so in the output), else skipped with the
reason. It needs only the package index; run it with the venv's Python:

    python scripts/check_pypi_resolution.py [--index-url URL] [--cpu-index-url URL]
                                            [--python PATH]

``--python`` resolves for another interpreter (its own pip runs the dry run), e.g. CPython 3.10
for Ubuntu 22.04 + Humble or 3.12 for Ubuntu 24.04 + Jazzy. The PyPI ROS 2 Kilted wheels are
CPython 3.11 only, so for any other Python the set leaves them out: ROS then comes from apt.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETUP = ROOT / "scripts" / "setup.sh"
KILTED_FILE = ROOT / "requirements" / "ros-kilted-pypi.txt"
CPU_TRITON_FILE = ROOT / "requirements" / "triton-for-cpu-torch.txt"
PYPI = "https://pypi.org/simple"
PYTORCH_CPU = "https://download.pytorch.org/whl/cpu"


def say(line: str) -> None:
    """One progress line, flushed so it shows before pip's long quiet stretch."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def setup_requirements(cpu_torch: bool, kilted: bool) -> list[str]:
    """The pip arguments setup.sh installs; the PyPI ROS wheels only when kilted is true."""
    cmd = ["bash", str(SETUP), "--print-requirements"] + (["--cpu-torch"] if cpu_torch else [])
    # The default torch spec and no torch index: what a user gets who sets nothing.
    env = {k: v for k, v in os.environ.items()
           if k not in ("HEISD_TORCH_SPEC", "HEISD_TORCH_INDEX")}
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    args = [line for line in out.splitlines() if line]
    if not kilted:  # drop the "-r <ros-kilted-pypi.txt>" pair
        at = args.index(str(KILTED_FILE))
        del args[at - 1:at + 1]
    return args


def python_tag(python: str) -> str:
    """The interpreter's CPython tag, e.g. cp311."""
    code = "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')"
    return subprocess.run([python, "-c", code], check=True, capture_output=True,
                          text=True).stdout.strip()


def clean_pip_env() -> dict[str, str]:
    """The environment without any PIP_* variable or pip configuration file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull  # pip then reads no configuration file at all
    return env


def resolve(python: str, args: list[str], index_url: str, extra: list[str]) -> dict:
    """Run the dry run; return pip's installation report, or exit with pip's own words."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [python, "-m", "pip", "--isolated", "install", "--dry-run",
               "--ignore-installed", "--quiet", "--report", str(report),
               "--index-url", index_url, *extra, *args]
        done = subprocess.run(cmd, capture_output=True, text=True, env=clean_pip_env())
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-25:])
            raise SystemExit(f"[pins] FAILED: the set does not resolve on {index_url}\n{tail}")
        return json.loads(report.read_text())


def installs(report: dict) -> dict[str, dict]:
    """The report's packages to install, by lower-case name."""
    return {item["metadata"]["name"].lower(): item for item in report["install"]}


def check_sources(report: dict, allowed_files: set[str]) -> None:
    """Fail unless every package comes from an index (or is one of allowed_files)."""
    local = [item["download_info"]["url"] for item in report["install"]
             if not item["download_info"]["url"].startswith(("https://", "http://"))
             and item["download_info"]["url"] not in allowed_files]
    if local:
        raise SystemExit("[pins] FAILED: these would come from this machine, not an index:\n  "
                         + "\n  ".join(local))


def triton_torch_requires(torch_item: dict) -> str | None:
    """The triton version this torch distribution pins, if any."""
    for req in torch_item["metadata"].get("requires_dist", []):
        match = re.match(r"triton\s*==\s*([^;\s]+)", req)
        if match:
            return match.group(1)
    return None


def pinned_cpu_triton() -> str:
    """The triton version requirements/triton-for-cpu-torch.txt pins."""
    for line in CPU_TRITON_FILE.read_text().splitlines():
        match = re.match(r"triton\s*==\s*([^;\s]+)", line)
        if match:
            return match.group(1)
    raise SystemExit(f"[pins] FAILED: {CPU_TRITON_FILE.name} pins no triton version")


def summary(report: dict) -> str:
    """How many packages, and which torch and triton."""
    pkgs = installs(report)
    torch = pkgs["torch"]["metadata"]["version"]
    triton = pkgs.get("triton", {}).get("metadata", {}).get("version", "none")
    return f"{len(pkgs)} packages, torch {torch}, triton {triton}"


def cpu_index_answers(url: str) -> bool:
    """Whether the CPU index lists torch within 10 s."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/torch/", timeout=10) as answer:
            return answer.status == 200
    except OSError:
        return False


def local_cpu_wheel(python: str, tag: str, torch_spec: str) -> Path | None:
    """A CPU wheel of the pinned torch for ``tag`` (e.g. cp311) in ``python``'s find-links."""
    version = torch_spec.partition("==")[2]
    if not version:
        return None
    listed = subprocess.run([python, "-m", "pip", "config", "list"],
                            capture_output=True, text=True).stdout
    folders = [folder for line in listed.splitlines() if "find-links" in line
               for folder in line.split("=", 1)[1].strip("'\" ").split()]
    folders += os.environ.get("PIP_FIND_LINKS", "").split()
    for folder in folders:
        for wheel in sorted(Path(folder).glob(f"torch-{version}+cpu-{tag}-*.whl")):
            return wheel
    return None


def main() -> int:
    """Resolve both variants; exit non-zero with the reason on the first failure."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index-url", default=os.environ.get("HEISD_PYPI_INDEX", PYPI))
    parser.add_argument("--cpu-index-url", default=PYTORCH_CPU)
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter to resolve for (default: this one)")
    opts = parser.parse_args()

    tag = python_tag(opts.python)
    kilted = tag == "cp311"
    if not kilted:
        say(f"[pins] {opts.python} is {tag}: leaving out {KILTED_FILE.name} (CPython 3.11 "
            "only); ROS 2 comes from apt there")
    reqs = setup_requirements(cpu_torch=False, kilted=kilted)
    torch_spec = next(r for r in reqs if r.startswith("torch"))
    say(f"[pins] resolving setup.sh's set with {torch_spec} on {opts.index_url} "
          f"for {tag} (no pip configuration, no local wheels)")
    report = resolve(opts.python, reqs, opts.index_url, [])
    check_sources(report, set())
    say(f"[pins]   resolves: {summary(report)}")
    needed = triton_torch_requires(installs(report)["torch"])
    pinned = pinned_cpu_triton()
    if needed is not None and needed != pinned:
        raise SystemExit(f"[pins] FAILED: {torch_spec} from the index requires triton=={needed}, "
                         f"{CPU_TRITON_FILE.relative_to(ROOT)} pins triton=={pinned}: "
                         f"pin triton=={needed} there")

    cpu_reqs = setup_requirements(cpu_torch=True, kilted=kilted)
    if cpu_index_answers(opts.cpu_index_url):
        where, extra, allowed = opts.cpu_index_url, ["--extra-index-url", opts.cpu_index_url], set()
        cpu_reqs = [r if r != torch_spec else f"{torch_spec}+cpu" for r in cpu_reqs]
    elif (wheel := local_cpu_wheel(opts.python, tag, torch_spec)) is not None:
        where, extra = f"the local wheel {wheel.name} ({opts.cpu_index_url} did not answer)", []
        allowed = {wheel.as_uri()}
        cpu_reqs = [r if r != torch_spec else str(wheel) for r in cpu_reqs]
    else:
        say(f"[pins] CPU build: skipped: {opts.cpu_index_url} did not answer and pip's "
              f"configuration names no local CPU wheel of {torch_spec}")
        return 0
    say(f"[pins] resolving the set with a CPU build of torch from {where}")
    report = resolve(opts.python, cpu_reqs, opts.index_url, extra)
    check_sources(report, allowed)
    if "+cpu" not in installs(report)["torch"]["metadata"]["version"]:
        raise SystemExit("[pins] FAILED: the CPU variant did not resolve to a CPU build of torch")
    say(f"[pins]   resolves: {summary(report)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
