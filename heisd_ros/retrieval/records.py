"""The payload stored with every DB point, and the retrieved :class:`Candidate`.

Payload schema (JSON, version ``PAYLOAD_SCHEMA_VERSION`` in ``store_config.py``)::

    task           str        the task (collection) the demonstration belongs to
    episode, step  int        demonstration index and control step within it
    bins           [7] int    the action taken here, as bins 0..255 (OpenVLA token order)
    action         [7] float  the same action in physical units (m, rad, gripper 0/1)
    next_bins      [n][7] int    the next n <= LOOKAHEAD actions of the same demonstration
    next_actions   [n][7] float
    ee_position_m  [3] float  end-effector position at this step (m, robot base frame)

Field names follow ``msg/RetrievalCandidate.msg`` where it has them (lookahead_* there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from heisd_ros.data.observation import ACTION_DIM

NUM_BINS = 256
LOOKAHEAD = 3  # the paper stores the current action plus the next 3
# A candidate's score is a cosine similarity: [-1, 1], plus what float16 vectors or int8
# quantization with rescoring can add by rounding. Anything else (NaN, inf, 1.5) is a broken
# backend, and a score decides whether an action runs without the VLA (verify-skip).
SCORE_TOLERANCE = 1e-3


def score_problem(score: Any) -> str:
    """"" for a usable similarity score, else why it is not (for error messages)."""
    try:
        value = float(score)
    except (TypeError, ValueError):
        return f"score: expected a number, got {score!r}"
    if not math.isfinite(value):
        return f"score: expected a finite cosine similarity, got {value}"
    if abs(value) > 1.0 + SCORE_TOLERANCE:
        return (f"score: expected a cosine similarity in [-1, 1] (+/- {SCORE_TOLERANCE}), "
                f"got {value}")
    return ""


def _bins(name: str, value: Any, rows: bool) -> np.ndarray:
    arr = np.asarray(value, dtype=np.int64)
    if rows and arr.size == 0:
        arr = arr.reshape(0, ACTION_DIM)  # no lookahead at the end of a demonstration
    shape_ok = arr.ndim == 2 and arr.shape[1] == ACTION_DIM if rows else arr.shape == (ACTION_DIM,)
    if not shape_ok:
        want = f"(n, {ACTION_DIM})" if rows else f"({ACTION_DIM},)"
        raise ValueError(f"{name}: expected shape {want}, got {arr.shape}")
    if arr.size and (arr.min() < 0 or arr.max() >= NUM_BINS):
        raise ValueError(f"{name}: expected bins in [0, {NUM_BINS - 1}], got {arr.tolist()}")
    return arr.astype(np.uint8)


def _floats(name: str, value: Any, shape: tuple[int, ...]) -> np.ndarray:
    arr = np.asarray(value, dtype=np.float64)
    if len(shape) == 2 and arr.size == 0:
        arr = arr.reshape(0, shape[1])
    if arr.ndim != len(shape) or any(
            s not in (-1, a) for s, a in zip(shape, arr.shape, strict=True)):
        raise ValueError(f"{name}: expected shape {shape} (-1 = any), got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}: expected finite values, got {arr.tolist()}")
    return arr


@dataclass(frozen=True, eq=False)
class StepRecord:
    """One demonstration step as stored in the DB (arrays are validated copies)."""

    task: str
    episode: int
    step: int
    bins: np.ndarray  # (7,) uint8
    action: np.ndarray  # (7,) float64, physical units
    lookahead_bins: np.ndarray  # (n, 7) uint8, n <= LOOKAHEAD
    lookahead_actions: np.ndarray  # (n, 7) float64
    ee_position_m: np.ndarray  # (3,) float64

    def __post_init__(self) -> None:
        if not isinstance(self.task, str) or not self.task.strip():
            raise ValueError(f"task: expected a non-empty string, got {self.task!r}")
        for name in ("episode", "step"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ValueError(f"{name}: expected an int >= 0, got {value!r}")
            object.__setattr__(self, name, int(value))
        set_ = object.__setattr__
        set_(self, "bins", _bins("bins", self.bins, rows=False))
        set_(self, "action", _floats("action", self.action, (ACTION_DIM,)))
        set_(self, "lookahead_bins", _bins("lookahead_bins", self.lookahead_bins, rows=True))
        set_(self, "lookahead_actions",
             _floats("lookahead_actions", self.lookahead_actions, (-1, ACTION_DIM)))
        set_(self, "ee_position_m", _floats("ee_position_m", self.ee_position_m, (3,)))
        n_bins, n_act = len(self.lookahead_bins), len(self.lookahead_actions)
        if n_bins != n_act or n_bins > LOOKAHEAD:
            raise ValueError(f"lookahead_bins/lookahead_actions: expected the same count "
                             f"<= {LOOKAHEAD}, got {n_bins} and {n_act}")

    def to_payload(self) -> dict[str, Any]:
        """The JSON payload stored with the point (plain Python types only)."""
        return {"task": self.task, "episode": self.episode, "step": self.step,
                "bins": self.bins.tolist(), "action": self.action.tolist(),
                "next_bins": self.lookahead_bins.tolist(),
                "next_actions": self.lookahead_actions.tolist(),
                "ee_position_m": self.ee_position_m.tolist()}

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> StepRecord:
        """Parse a stored payload; ValueError names the missing or malformed field."""
        keys = ("task", "episode", "step", "bins", "action", "next_bins", "next_actions",
                "ee_position_m")
        missing = [k for k in keys if k not in payload]
        if missing:
            raise ValueError(f"payload: missing fields {missing}")
        return cls(task=payload["task"], episode=payload["episode"], step=payload["step"],
                   bins=payload["bins"], action=payload["action"],
                   lookahead_bins=payload["next_bins"],
                   lookahead_actions=payload["next_actions"],
                   ee_position_m=payload["ee_position_m"])


@dataclass(frozen=True, eq=False)
class Candidate:
    """A retrieved draft: DB point id, cosine similarity to the query, and the stored step."""

    id: int
    score: float
    record: StepRecord

    def __post_init__(self) -> None:
        problem = score_problem(self.score)
        if problem:
            raise ValueError(f"candidate {self.id}: {problem}")

    @property
    def bins(self) -> np.ndarray:
        """(7,) uint8 bins of the retrieved action."""
        return self.record.bins

    @property
    def action(self) -> np.ndarray:
        """(7,) physical action (m, rad, gripper 0/1) of the retrieved step."""
        return self.record.action


def records_from_episode(task: str, episode: int, bins: np.ndarray, actions: np.ndarray,
                         ee_positions_m: np.ndarray,
                         lookahead: int = LOOKAHEAD) -> list[StepRecord]:
    """One record per step of a demonstration, each with the following ``lookahead`` actions.

    Args:
        task: the task (collection) of the demonstration.
        episode: demonstration index.
        bins: (T, 7) action bins.
        actions: (T, 7) physical actions.
        ee_positions_m: (T, 3) end-effector positions.
        lookahead: following actions stored with each step (0..LOOKAHEAD).
    """
    bins = _bins("bins", bins, rows=True)
    actions = _floats("actions", actions, (-1, ACTION_DIM))
    ee = _floats("ee_positions_m", ee_positions_m, (-1, 3))
    if not len(bins) == len(actions) == len(ee):
        raise ValueError(f"bins/actions/ee_positions_m: lengths differ: {len(bins)}, "
                         f"{len(actions)}, {len(ee)}")
    if not 0 <= lookahead <= LOOKAHEAD:
        raise ValueError(f"lookahead: expected 0..{LOOKAHEAD}, got {lookahead}")
    return [StepRecord(task=task, episode=episode, step=t, bins=bins[t], action=actions[t],
                       lookahead_bins=bins[t + 1:t + 1 + lookahead],
                       lookahead_actions=actions[t + 1:t + 1 + lookahead],
                       ee_position_m=ee[t]) for t in range(len(bins))]
