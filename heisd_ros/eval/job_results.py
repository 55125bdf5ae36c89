"""Finished jobs of a heisd-eval run kept on disk, so an interrupted run resumes where it stopped.

``heisd-eval --json PATH`` writes every finished job (the episodes of one task name, all methods)
to ``PATH.parts/<task>.json.gz`` as it ends, and deletes the folder once ``PATH`` is written.
``--resume`` reads back the jobs made by the same code, options and input files (the run's
fingerprint) and runs only the rest. A part with another fingerprint is never used.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import shutil
from collections.abc import Iterable
from pathlib import Path

from heisd_ros.eval.closed_loop import EpisodeRun
from heisd_ros.eval.report import jsonable

PACKAGE = Path(__file__).resolve().parents[1]
#: Largest input file hashed by content; a bigger one (a 7B checkpoint) by size and mtime.
MAX_HASHED_BYTES = 512 * 2**20


def run_fingerprint(options: dict, files: Iterable[str | None]) -> str:
    """sha256 over the options, this package's code and assets, and the named input files.

    Args:
        options: what decides the episodes' outcome and timing (JSON-able values).
        files: input paths (target, draft head, calibration, ...); None and missing ones are
            named as such, folders by their path (a DB or a checkpoint folder).
    """
    h = hashlib.sha256(json.dumps(options, sort_keys=True, default=str).encode())
    for path in sorted(PACKAGE.rglob("*")):
        if path.is_file() and path.suffix in (".py", ".safetensors", ".json", ".yaml"):
            h.update(str(path.relative_to(PACKAGE)).encode())
            h.update(path.read_bytes())
    for name in files:
        h.update(f"\0{name}".encode())
        path = Path(name) if name else None
        if path is None or not path.is_file():
            continue
        stat = path.stat()
        if stat.st_size <= MAX_HASHED_BYTES:
            h.update(hashlib.sha256(path.read_bytes()).digest())
        else:
            h.update(f"{stat.st_size} {stat.st_mtime_ns}".encode())
    return h.hexdigest()


class JobResults:
    """The parts folder of one run: save a finished job, load one back, clear or remove all."""

    #: File name ending of a kept job (``<job>.json.gz``).
    SUFFIX = ".json.gz"

    def __init__(self, json_path: str | Path, fingerprint: str) -> None:
        self.folder = Path(f"{json_path}.parts")
        self.fingerprint = fingerprint

    def path(self, job: str) -> Path:
        """Where job ``job`` is kept."""
        return self.folder / f"{job}{self.SUFFIX}"

    def save(self, job: str, runs: list[EpisodeRun], desc: dict) -> None:
        """Write one finished job atomically (a crash mid-write leaves no readable part)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        data = {"fingerprint": self.fingerprint, "job": job, "desc": desc,
                "runs": [dataclasses.asdict(r) for r in runs]}
        tmp = self.path(job).with_suffix(".tmp")
        with gzip.open(tmp, "wt") as out:
            json.dump(data, out, default=jsonable)
        tmp.replace(self.path(job))

    def load(self, job: str) -> tuple[list[EpisodeRun], dict] | None:
        """(runs, model description) of a job saved with this fingerprint, else None."""
        try:
            with gzip.open(self.path(job), "rt") as f:
                data = json.load(f)
        except (OSError, EOFError, json.JSONDecodeError):
            return None  # not there, or cut short: the job runs again
        if data.get("fingerprint") != self.fingerprint or data.get("job") != job:
            return None
        return [EpisodeRun(**r) for r in data["runs"]], data["desc"]

    def saved(self) -> list[str]:
        """The jobs kept so far (by any run), sorted."""
        return sorted(f.name.removesuffix(self.SUFFIX) for f in self.folder.glob(f"*{self.SUFFIX}"))

    def clear(self) -> None:
        """Forget every saved job (a run that does not resume starts from nothing)."""
        shutil.rmtree(self.folder, ignore_errors=True)
