"""Window geometry for the kinematic router: curvature radius R and cumulative displacement D.

R (HeiSD component 4): project the window of end-effector positions onto its best-fit plane
(PCA via SVD), fit a circle in that plane, and take the mean distance of the projected points
to the centre. The circle fit is Taubin's algebraic fit in the SVD form of N. Chernov
("Circular and Linear Regression: Fitting Circles and Lines by Least Squares", 2010, and his
public ``TaubinSVD.m``); unlike the Kasa fit it is nearly unbiased on short arcs, which is what
a 15-step window of a slow motion looks like.

Degenerate windows (ours): collinear points -> R = +inf ("very straight", clipped later by the
normalisation); all points (almost) at one place -> R = 0 (no motion, treated like tight
curvature, so a standing arm is routed to the drafter).
"""

from __future__ import annotations

import numpy as np

#: Spread (m, RMS distance to the centroid) below which a window counts as standing still.
STATIONARY_TOL_M = 1e-6
#: Ratio of the 2nd to the 1st principal extent below which a window counts as a line.
COLLINEAR_RATIO = 1e-6


def _as_points(points_m: np.ndarray, dim: int) -> np.ndarray:
    pts = np.asarray(points_m, dtype=np.float64)
    if pts.ndim != 2 or pts.shape[1] != dim:
        raise ValueError(f"points_m: expected shape (n, {dim}), got {pts.shape}")
    if not np.all(np.isfinite(pts)):
        raise ValueError("points_m: expected finite coordinates")
    return pts


def best_fit_plane(points_m: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Centroid (3,), in-plane orthonormal basis (2, 3) and singular values (3,) of a window.

    The basis rows are the two principal directions; the plane normal is the third.
    """
    pts = _as_points(points_m, 3)
    centroid = pts.mean(axis=0)
    _, sing, vt = np.linalg.svd(pts - centroid, full_matrices=False)
    sing = np.pad(sing, (0, 3 - len(sing)))  # fewer than 3 points: missing extents are 0
    return centroid, vt[:2], sing


def fit_circle(points_xy: np.ndarray) -> tuple[np.ndarray, float]:
    """Taubin circle fit (SVD form, after Chernov): centre (2,) and radius of 2-D points.

    Returns an infinite radius (and a NaN centre) when the points are collinear.
    """
    pts = _as_points(points_xy, 2)
    if len(pts) < 3:
        raise ValueError(f"points_xy: a circle needs >= 3 points, got {len(pts)}")
    centroid = pts.mean(axis=0)
    x, y = (pts - centroid).T
    z = x * x + y * y
    z_mean = z.mean()
    if z_mean <= 0.0:
        return np.full(2, np.nan), float("inf")
    # Rows [ (z - mean z) / (2 sqrt(mean z)), x, y ]: the Taubin constraint turns into an
    # ordinary SVD; the circle's algebraic parameters are the last right-singular vector.
    z0 = (z - z_mean) / (2.0 * np.sqrt(z_mean))
    _, sing, vt = np.linalg.svd(np.column_stack([z0, x, y]), full_matrices=False)
    a = vt[2].copy()
    a[0] /= 2.0 * np.sqrt(z_mean)
    a0, a1, a2 = a
    a3 = -z_mean * a0
    # A line is the limit a0 -> 0 (infinite radius); compare against the in-plane scale.
    if abs(a0) * np.sqrt(z_mean) <= COLLINEAR_RATIO * np.hypot(a1, a2):
        return np.full(2, np.nan), float("inf")
    centre = np.array([-a1 / (2.0 * a0), -a2 / (2.0 * a0)]) + centroid
    radius = np.sqrt(a1 * a1 + a2 * a2 - 4.0 * a0 * a3) / (2.0 * abs(a0))
    return centre, float(radius)


def curvature_radius_m(points_m: np.ndarray) -> float:
    """R of a window of 3-D positions (m): mean distance to the fitted circle's centre."""
    pts = _as_points(points_m, 3)
    if len(pts) < 3:
        raise ValueError(f"points_m: curvature needs >= 3 points, got {len(pts)}")
    centroid, basis, sing = best_fit_plane(pts)
    spread_m = sing[0] / np.sqrt(len(pts))
    if spread_m < STATIONARY_TOL_M:
        return 0.0
    if sing[1] <= COLLINEAR_RATIO * sing[0]:
        return float("inf")
    xy = (pts - centroid) @ basis.T
    centre, radius = fit_circle(xy)
    if not np.isfinite(radius):
        return float("inf")
    return float(np.linalg.norm(xy - centre, axis=1).mean())


def cumulative_displacement_m(points_m: np.ndarray) -> float:
    """D of a window (m): the sum of step lengths, direction ignored."""
    pts = _as_points(points_m, 3)
    if len(pts) < 2:
        return 0.0
    return float(np.linalg.norm(np.diff(pts, axis=0), axis=1).sum())


def window_metrics(points_m: np.ndarray) -> tuple[float, float]:
    """(R in m, D in m) of one window; see the module docstring for degenerate windows."""
    return curvature_radius_m(points_m), cumulative_displacement_m(points_m)
