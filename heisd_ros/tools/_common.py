"""Helpers shared by the decoding tools (``heisd-train-drafter``, ``heisd-bench``)."""

from __future__ import annotations

import hashlib
from pathlib import Path

#: Where the shipped small-VLA weights live once trained (written by the simulator issue).
DEFAULT_TARGET_PATH = Path(__file__).resolve().parent.parent / "assets" / "small_vla.safetensors"


def load_target(path: str | None, seed: int = 0):
    """(target, description) of the small VLA to use.

    From ``path``, else the shipped weights if present, else a seeded random initialisation
    of the default config.
    """
    from heisd_ros.models.checkpoint import load_small_vla
    from heisd_ros.models.small_vla import SmallVLA

    if path is None and DEFAULT_TARGET_PATH.is_file():
        path = str(DEFAULT_TARGET_PATH)
    if path is None:
        return SmallVLA.random(seed=seed), f"random-init small VLA (seed={seed})"
    return load_small_vla(path), f"{path} (sha256 {file_digest(path)})"


def file_digest(path) -> str:
    """First 16 hex digits of the file's sha256 (identifies the exact weights used)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def int_vector(text: str, length: int, name: str) -> tuple[int, ...]:
    """Parse "a,b,c" (or a single value repeated) into ``length`` ints."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError as err:
        raise ValueError(f"{name}: expected comma-separated ints, got {text!r}") from err
    if len(values) == 1:
        values = values * length
    if len(values) != length:
        raise ValueError(f"{name}: expected {length} values, got {len(values)}")
    return tuple(values)


def set_threads(threads: int | None) -> None:
    """Limit torch's intra-op threads (the machine is shared; benches should say how many)."""
    if threads:
        import torch

        torch.set_num_threads(threads)
