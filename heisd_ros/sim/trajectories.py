"""Waypoint generators with the kinematic profile of human demonstrations.

Teleoperated demonstrations move fast and nearly straight through free space with a
bell-shaped speed profile, then slow down and come in on a curved path near contact. The two
generators here produce exactly those two kinds of segment, one waypoint per control step.
"""

from __future__ import annotations

import numpy as np

from heisd_ros.geometry.rotations import matrix_to_rotvec


def _min_jerk_at(t):
    return 10 * t**3 - 15 * t**4 + 6 * t**5


def check_head_start(value: float, name: str = "head_start") -> None:
    """ValueError naming ``name`` unless ``value`` is a minimum-jerk head start, [0, 0.5)."""
    if not 0.0 <= value < 0.5:
        raise ValueError(f"{name}: expected [0, 0.5), got {value}")


def min_jerk(n_steps: int, head_start: float = 0.0) -> np.ndarray:
    """Progress s(t) in (0, 1] at t = 1/n .. 1 of a minimum-jerk move (bell-shaped speed).

    ``head_start`` in [0, 0.5) skips that fraction of the profile's time, renormalised, so the
    move starts at a speed instead of from rest (0.2: 41% of the peak speed); the end stays a
    smooth stop. A policy that sees one frame cannot tell "about to start" from "standing":
    from rest, the first steps of a minimum-jerk move are ~0, a still state whose label is
    ~0, which a memoryless policy never leaves.
    """
    check_head_start(head_start)
    t = head_start + (1.0 - head_start) * np.arange(1, n_steps + 1) / n_steps
    s0 = _min_jerk_at(head_start)
    return (_min_jerk_at(t) - s0) / (1.0 - s0)


def min_jerk_peak_factor(head_start: float = 0.0) -> float:
    """Peak over mean speed of :func:`min_jerk` with ``head_start`` (1.875 without)."""
    check_head_start(head_start)
    return 1.875 * (1.0 - head_start) / (1.0 - _min_jerk_at(head_start))


def ease_out(n_steps: int) -> np.ndarray:
    """Progress that starts at a modest speed and decelerates into contact (quadratic ease-out)."""
    t = np.arange(1, n_steps + 1) / n_steps
    return 1.0 - (1.0 - t) ** 2


def steps_for(distance_m: float, angle_rad: float, peak_speed_mps: float,
              peak_rate_rad_s: float, rate_hz: float, peak_factor: float) -> int:
    """Steps needed so neither the peak linear nor the peak angular speed is exceeded.

    ``peak_factor`` is the profile's peak speed over its mean speed (1.875 for minimum jerk,
    2 for the quadratic ease-out).
    """
    duration_s = peak_factor * max(distance_m / peak_speed_mps, angle_rad / peak_rate_rad_s)
    return max(2, int(np.ceil(duration_s * rate_hz)))


def slerp_matrices(start: np.ndarray, end: np.ndarray, progress: np.ndarray) -> list[np.ndarray]:
    """Rotations from ``start`` to ``end`` at each progress value (geodesic, base frame)."""
    axis_angle = matrix_to_rotvec(end @ start.T)
    out = []
    for s in progress:
        angle = float(np.linalg.norm(axis_angle)) * s
        if angle < 1e-12:
            out.append(start.copy())
            continue
        k = axis_angle / np.linalg.norm(axis_angle)
        skew = np.array([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
        rot = np.eye(3) + np.sin(angle) * skew + (1 - np.cos(angle)) * skew @ skew
        out.append(rot @ start)
    return out


def straight_transit(start_m: np.ndarray, end_m: np.ndarray, n_steps: int,
                     bow_m: np.ndarray | None = None, head_start: float = 0.0) -> np.ndarray:
    """(n, 3) minimum-jerk points from start to end (``head_start``: see :func:`min_jerk`).

    ``bow_m`` bends the path by that offset at mid-course: a slight arc, as a human hand makes,
    instead of a ruler-straight line.
    """
    s = min_jerk(n_steps, head_start)[:, None]
    path = start_m + s * (end_m - start_m)
    if bow_m is not None:
        path += (4.0 * s * (1.0 - s)) * bow_m
    return path


def curved_approach(start_m: np.ndarray, end_m: np.ndarray, n_steps: int) -> np.ndarray:
    """(n, 3) points on a quadratic Bezier from start to end that arrives vertically.

    The control point sits straight above the end point at the start's height minus a third
    of the drop, so the path first slides sideways-down and finishes with a vertical descent
    onto the contact point, at decelerating speed.
    """
    control = np.array([end_m[0], end_m[1], end_m[2] + 0.66 * (start_m[2] - end_m[2])])
    s = ease_out(n_steps)[:, None]
    return (1 - s) ** 2 * start_m + 2 * (1 - s) * s * control + s**2 * end_m
