"""Per-dimension q01/q99 normalisation of actions and the action <-> bins codec.

OpenVLA normalises each action dimension with the dataset's 1st/99th percentiles to [-1, 1]
(``2 * (a - q01) / (q99 - q01) - 1``, clipped) except where the statistics' ``mask`` is False:
the gripper stays un-normalised (its raw value, 0 = open .. 1 = closed here, is tokenised as
is) and is binarised when decoded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from heisd_ros.actions.bins import bins_to_values, values_to_bins
from heisd_ros.data.observation import ACTION_DIM, check_action

# Denominator guard for a dimension whose q01 == q99 (constant in the data), as in OpenVLA.
_EPS = 1e-8
#: OpenVLA's action-bin range: the [q, 1 - q] quantiles of the training actions.
OPENVLA_QUANTILE = 0.01


def _vector(name: str, value, dtype) -> np.ndarray:
    arr = np.asarray(value, dtype=dtype)
    if arr.shape != (ACTION_DIM,):
        raise ValueError(f"{name}: expected {ACTION_DIM} values, got shape {arr.shape}")
    if dtype is not bool and not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}: expected finite values, got {arr.tolist()}")
    return arr


@dataclass(frozen=True)
class ActionStats:
    """Normalisation statistics of one dataset (units of each action dimension: m, rad, -).

    Attributes:
        q01, q99: per-dimension 1st and 99th percentiles, (7,).
        mask: per-dimension True = normalise; False = pass through (the gripper).
        gripper_threshold: an un-normalised gripper value above it decodes to 1 (closed).
    """

    q01: np.ndarray = field(default_factory=lambda: np.array(
        [-0.02, -0.02, -0.02, -0.15, -0.15, -0.15, 0.0]))
    q99: np.ndarray = field(default_factory=lambda: np.array(
        [0.02, 0.02, 0.02, 0.15, 0.15, 0.15, 1.0]))
    mask: np.ndarray = field(default_factory=lambda: np.array([True] * 6 + [False]))
    gripper_threshold: float = 0.5

    def __post_init__(self) -> None:
        q01 = _vector("q01", self.q01, np.float64)
        q99 = _vector("q99", self.q99, np.float64)
        mask = _vector("mask", self.mask, bool)
        bad = np.nonzero(mask & (q99 < q01))[0]
        if bad.size:
            raise ValueError(f"q99: below q01 in dimensions {bad.tolist()} "
                             f"(q01={q01.tolist()}, q99={q99.tolist()})")
        if mask[-1]:
            raise ValueError("mask: the gripper (last dimension) must stay un-normalised (False)")
        if not np.isfinite(self.gripper_threshold):
            raise ValueError(f"gripper_threshold: expected a finite value, "
                             f"got {self.gripper_threshold}")
        object.__setattr__(self, "q01", q01)
        object.__setattr__(self, "q99", q99)
        object.__setattr__(self, "mask", mask)

    def normalise(self, action: np.ndarray) -> np.ndarray:
        """Physical action (7,) -> normalised (7,) in [-1, 1] (masked dims only clipped)."""
        a = check_action(action)
        scaled = 2.0 * (a - self.q01) / (self.q99 - self.q01 + _EPS) - 1.0
        return np.clip(np.where(self.mask, scaled, a), -1.0, 1.0)

    def unnormalise(self, normalised: np.ndarray) -> np.ndarray:
        """Normalised (7,) -> physical action (7,), gripper binarised to {0, 1}."""
        n = check_action(normalised)
        a = np.where(self.mask, 0.5 * (n + 1.0) * (self.q99 - self.q01) + self.q01, n)
        a[-1] = 1.0 if a[-1] > self.gripper_threshold else 0.0
        return a

    def to_json(self) -> str:
        """The statistics as JSON (lists of floats/bools)."""
        return json.dumps({"q01": self.q01.tolist(), "q99": self.q99.tolist(),
                           "mask": self.mask.tolist(), "gripper_threshold": self.gripper_threshold})

    @classmethod
    def from_json(cls, text: str) -> ActionStats:
        """Statistics from :meth:`to_json` output."""
        data = json.loads(text)
        return cls(q01=data["q01"], q99=data["q99"], mask=data["mask"],
                   gripper_threshold=data.get("gripper_threshold", 0.5))

    @classmethod
    def from_actions(cls, actions: np.ndarray,
                     quantile: float = OPENVLA_QUANTILE) -> ActionStats:
        """Statistics of a dataset of physical actions (T, 7), gripper left un-normalised.

        ``quantile``: the range is [quantile, 1 - quantile] per dimension (OpenVLA: 0.01,
        the 1st/99th percentiles; the fields keep the names q01/q99 whatever it is). Every
        action outside the range is clipped into the first or last bin, so those two bins
        collect the whole tail mass: 1% per side is a spike next to ~0.4% per inner bin, and
        the greedy token of an uncertain model lands on it (a full-speed step) although the
        distribution's bulk is elsewhere. A smaller quantile (0.001) keeps the edges rare.
        """
        arr = np.asarray(actions, dtype=np.float64)
        if arr.ndim != 2 or arr.shape[1] != ACTION_DIM or len(arr) < 2:
            raise ValueError(f"actions: expected (T >= 2, {ACTION_DIM}), got {arr.shape}")
        if not 0.0 <= quantile < 0.5:
            raise ValueError(f"quantile: expected [0, 0.5), got {quantile}")
        q01, q99 = np.quantile(arr, quantile, axis=0), np.quantile(arr, 1.0 - quantile, axis=0)
        q01[-1], q99[-1] = 0.0, 1.0
        return cls(q01=q01, q99=q99)


@dataclass(frozen=True)
class ActionCodec:
    """Physical actions <-> the 7 bins a VLA emits."""

    stats: ActionStats = field(default_factory=ActionStats)

    def encode(self, action: np.ndarray) -> np.ndarray:
        """Physical action (7,) -> bins (7,) int64 in 0..255."""
        return values_to_bins(self.stats.normalise(action))

    def decode(self, bins: np.ndarray) -> np.ndarray:
        """Bins (7,) -> physical action (7,): dx, dy, dz in m, drx, dry, drz in rad, gripper 0/1."""
        arr = np.asarray(bins, dtype=np.int64)
        if arr.shape != (ACTION_DIM,):
            raise ValueError(f"bins: expected shape ({ACTION_DIM},), got {arr.shape}")
        return self.stats.unnormalise(bins_to_values(arr))
