"""Kinematic router (HeiSD component 4): retrieval on fast, straight motion, drafter otherwise.

    F = alpha * Norm(R) + (1 - alpha) * Norm(D)

R and D come from the last ``window`` executed end-effector positions (``geometry.py``).
Norm clips at the statistics' upper percentile (95th by default) and min-max scales to [0, 1];
the statistics are fitted per task suite from demonstration trajectories
(:meth:`RouterStats.fit`) and saved as JSON. F >= ``threshold`` -> retrieval. The threshold is
calibrated offline and reported with every decision. Fewer than ``min_points`` positions
(the start of an episode) -> drafter, with F = NaN.

Usage::

    stats = RouterStats.fit(trajectories_m, window=15, suite="libero_goal")
    stats.save("router_stats.json")
    router = KinematicRouter(RouterConfig(threshold=0.42), RouterStats.load("router_stats.json"))
    decision = router.decide(ee_positions_m)      # (n, 3), oldest first
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from heisd_ros.kinematics.geometry import window_metrics

#: heisd-build-db writes one statistics file per suite in the DB directory, named so.
ROUTER_STATS_PREFIX = "router_stats_"
MODE_RETRIEVAL = "retrieval"
MODE_DRAFTER = "drafter"
_MIN_WINDOW = 3  # a circle needs three points


@dataclass(frozen=True)
class RouterConfig:
    """Router parameters (paper defaults alpha = 0.5, w = 15; ``threshold`` is calibrated).

    Attributes:
        alpha: weight of the curvature term Norm(R) in F.
        window: number of most recent EE positions used (w).
        threshold: F at or above which the retrieval draft source is used.
        min_points: fewer positions than this -> drafter (0 = require a full window).
    """

    alpha: float = 0.5
    window: int = 15
    threshold: float = 0.5
    min_points: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha: expected 0..1, got {self.alpha}")
        if self.window < _MIN_WINDOW:
            raise ValueError(f"window: expected >= {_MIN_WINDOW} positions, got {self.window}")
        if not (math.isfinite(self.threshold) and 0.0 <= self.threshold <= 1.0):
            raise ValueError(f"threshold: expected 0..1 (F is normalised), got {self.threshold}")
        if self.min_points != 0 and not _MIN_WINDOW <= self.min_points <= self.window:
            raise ValueError(f"min_points: expected 0 or {_MIN_WINDOW}..window={self.window}, "
                             f"got {self.min_points}")

    @property
    def required_points(self) -> int:
        """Fewest positions with which the router computes F."""
        return self.min_points or self.window


@dataclass(frozen=True)
class RouterStats:
    """Normalisation statistics of R and D for one task suite (metres)."""

    radius_lo_m: float
    radius_hi_m: float
    displacement_lo_m: float
    displacement_hi_m: float
    window: int
    percentile: float = 95.0
    suite: str = ""
    n_windows: int = 0

    def __post_init__(self) -> None:
        for lo, hi in (("radius_lo_m", "radius_hi_m"),
                       ("displacement_lo_m", "displacement_hi_m")):
            a, b = getattr(self, lo), getattr(self, hi)
            if not (math.isfinite(a) and math.isfinite(b) and 0.0 <= a < b):
                raise ValueError(f"{lo}/{hi}: expected finite 0 <= lo < hi, got {a}, {b}")
        if self.window < _MIN_WINDOW:
            raise ValueError(f"window: expected >= {_MIN_WINDOW}, got {self.window}")
        if not 50.0 <= self.percentile <= 100.0:
            raise ValueError(f"percentile: expected 50..100, got {self.percentile}")

    @classmethod
    def fit(cls, trajectories_m: Iterable[np.ndarray], window: int = 15,
            percentile: float = 95.0, suite: str = "") -> RouterStats:
        """Fit from EE trajectories ((T, 3) arrays, m) over every full sliding window.

        lo = smallest value; hi = the ``percentile``-th value (an observed sample, so an
        infinite R of a straight window is clipped rather than poisoning the interpolation;
        if that sample is infinite, the largest finite R is used instead).
        """
        radii, disps = [], []
        for traj in trajectories_m:
            pts = np.asarray(traj, dtype=np.float64)
            if pts.ndim != 2 or pts.shape[1] != 3:
                raise ValueError(f"trajectories_m: expected (T, 3) arrays, got {pts.shape}")
            for start in range(len(pts) - window + 1):
                r, d = window_metrics(pts[start:start + window])
                radii.append(r)
                disps.append(d)
        if len(radii) < 2:
            raise ValueError(f"trajectories_m: need >= 2 windows of {window} positions, "
                             f"got {len(radii)}")
        r_lo, r_hi = _lo_hi(np.asarray(radii), percentile)
        d_lo, d_hi = _lo_hi(np.asarray(disps), percentile)
        return cls(r_lo, r_hi, d_lo, d_hi, window=window, percentile=percentile, suite=suite,
                   n_windows=len(radii))

    def norm_radius(self, radius_m: float) -> float:
        """Norm(R) in [0, 1]; an infinite radius maps to 1."""
        return _norm(radius_m, self.radius_lo_m, self.radius_hi_m)

    def norm_displacement(self, displacement_m: float) -> float:
        """Norm(D) in [0, 1]."""
        return _norm(displacement_m, self.displacement_lo_m, self.displacement_hi_m)

    def save(self, path: str | Path) -> None:
        """Write the statistics as JSON."""
        Path(path).write_text(json.dumps(asdict(self), indent=2), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> RouterStats:
        """Read statistics written by :meth:`save`; ValueError if the file is not one."""
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        try:
            return cls(**data)
        except TypeError as exc:
            raise ValueError(f"{path}: not a RouterStats file: {exc}") from exc


def _lo_hi(values: np.ndarray, percentile: float) -> tuple[float, float]:
    finite = values[np.isfinite(values)]
    if finite.size == 0:  # every window straight: any finite scale maps inf to 1
        return 0.0, 1.0
    lo = float(finite.min())
    hi = float(np.percentile(values, percentile, method="inverted_cdf"))
    if not math.isfinite(hi):
        hi = float(finite.max())
    if hi <= lo:  # constant data: a step at lo
        hi = lo + max(abs(lo) * 1e-6, 1e-9)
    return lo, hi


def _norm(value: float, lo: float, hi: float) -> float:
    """Clip to [lo, hi] (inf -> hi) and scale to [0, 1]."""
    return (min(max(value, lo), hi) - lo) / (hi - lo)


@dataclass(frozen=True)
class RouteDecision:
    """What the router chose and why (NaN metrics while the window is too short)."""

    mode: str  # MODE_RETRIEVAL or MODE_DRAFTER
    fused: float  # F
    norm_radius: float  # Norm(R) in [0, 1]
    norm_displacement: float  # Norm(D) in [0, 1]
    radius_m: float  # R (inf for a straight window)
    displacement_m: float  # D
    threshold: float
    n_points: int  # positions used


class KinematicRouter:
    """Chooses the draft source from the recent end-effector path."""

    def __init__(self, config: RouterConfig, stats: RouterStats) -> None:
        if stats.window != config.window:
            raise ValueError(f"stats.window: statistics were fitted on windows of "
                             f"{stats.window} positions but the router uses {config.window}; "
                             f"D scales with the window, refit or change window")
        self.config = config
        self.stats = stats

    def decide(self, ee_positions_m: np.ndarray) -> RouteDecision:
        """Route from positions (n, 3) in m, oldest first; only the last ``window`` are used."""
        pts = np.asarray(ee_positions_m, dtype=np.float64).reshape(-1, 3)
        pts = pts[-self.config.window:]
        cfg = self.config
        if len(pts) < cfg.required_points:
            nan = float("nan")
            return RouteDecision(MODE_DRAFTER, nan, nan, nan, nan, nan, cfg.threshold, len(pts))
        radius_m, displacement_m = window_metrics(pts)
        n_r = self.stats.norm_radius(radius_m)
        n_d = self.stats.norm_displacement(displacement_m)
        fused = cfg.alpha * n_r + (1.0 - cfg.alpha) * n_d
        mode = MODE_RETRIEVAL if fused >= cfg.threshold else MODE_DRAFTER
        return RouteDecision(mode, fused, n_r, n_d, radius_m, displacement_m, cfg.threshold,
                             len(pts))

    def fused_series(self, trajectory_m: np.ndarray) -> np.ndarray:
        """F after every step of a (T, 3) trajectory (NaN while too short), for calibration.

        Entry t is what :meth:`decide` returns given positions 0..t, so an offline tool can
        relate F to where retrieval drafts were accepted and choose ``threshold``.
        """
        pts = np.asarray(trajectory_m, dtype=np.float64).reshape(-1, 3)
        return np.array([self.decide(pts[:t + 1]).fused for t in range(len(pts))])


def router_stats_file(db_dir: str | Path, suite: str) -> Path:
    """Where heisd-build-db writes (and every front end looks for) ``suite``'s statistics."""
    return Path(db_dir) / f"{ROUTER_STATS_PREFIX}{suite}.json"


def router_stats_files(db_dir: str | Path | None) -> dict[str, Path]:
    """``{suite: path}`` of the statistics files in ``db_dir`` (empty: none, or no directory)."""
    root = Path(db_dir) if db_dir else None
    if root is None or not root.is_dir():
        return {}
    return {p.name[len(ROUTER_STATS_PREFIX):-len(".json")]: p
            for p in sorted(root.glob(f"{ROUTER_STATS_PREFIX}*.json")) if p.is_file()}
