"""Window geometry: plane projection, Taubin circle fit, R and D, degenerate windows."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heisd_ros.kinematics.geometry import (
    best_fit_plane,
    cumulative_displacement_m,
    curvature_radius_m,
    fit_circle,
    window_metrics,
)


def _rotation(yaw: float, pitch: float, roll: float) -> np.ndarray:
    cy, sy, cp, sp, cr, sr = (math.cos(yaw), math.sin(yaw), math.cos(pitch), math.sin(pitch),
                              math.cos(roll), math.sin(roll))
    rz = np.array([[cy, -sy, 0], [sy, cy, 0], [0, 0, 1]])
    ry = np.array([[cp, 0, sp], [0, 1, 0], [-sp, 0, cp]])
    rx = np.array([[1, 0, 0], [0, cr, -sr], [0, sr, cr]])
    return rz @ ry @ rx


def tilted_arc(radius_m, n, span_rad, angles, centre, noise_m=0.0, seed=0):
    t = np.linspace(0.0, span_rad, n)
    flat = np.stack([radius_m * np.cos(t), radius_m * np.sin(t), np.zeros(n)], axis=1)
    pts = flat @ _rotation(*angles).T + np.asarray(centre)
    return pts + np.random.default_rng(seed).normal(scale=noise_m, size=pts.shape)


angles_st = st.tuples(*[st.floats(-math.pi, math.pi)] * 3)
centre_st = st.tuples(*[st.floats(-2.0, 2.0)] * 3)


@settings(max_examples=60, deadline=None)
@given(radius=st.floats(0.01, 2.0), n=st.integers(12, 40), span=st.floats(2.0, 2 * math.pi),
       angles=angles_st, centre=centre_st, rel_noise=st.floats(0.0, 0.005),
       seed=st.integers(0, 2**31))
def test_recovers_radius_of_noisy_tilted_circle(radius, n, span, angles, centre, rel_noise,
                                                seed):
    pts = tilted_arc(radius, n, span, angles, centre, noise_m=rel_noise * radius, seed=seed)
    assert curvature_radius_m(pts) == pytest.approx(radius, rel=0.03)


@settings(max_examples=30, deadline=None)
@given(radius=st.floats(0.01, 5.0), angles=angles_st, centre=centre_st)
def test_exact_points_give_exact_radius_and_plane(radius, angles, centre):
    pts = tilted_arc(radius, 15, 1.5, angles, centre)
    assert curvature_radius_m(pts) == pytest.approx(radius, rel=1e-6)
    _, basis, sing = best_fit_plane(pts)
    normal = np.cross(basis[0], basis[1])
    expected_normal = _rotation(*angles)[:, 2]
    assert abs(abs(normal @ expected_normal) - 1.0) < 1e-6
    assert sing[2] < 1e-9 * max(sing[0], 1e-12)


def test_fit_circle_2d_centre():
    t = np.linspace(0, 3, 20)
    centre, radius = fit_circle(np.stack([1 + 0.3 * np.cos(t), -2 + 0.3 * np.sin(t)], axis=1))
    np.testing.assert_allclose(centre, [1, -2], atol=1e-9)
    assert radius == pytest.approx(0.3)


def test_collinear_window_is_infinitely_straight():
    line = np.linspace([0.1, 0.2, 0.3], [0.4, -0.1, 0.5], 15)
    r, d = window_metrics(line)
    assert r == math.inf
    assert d == pytest.approx(np.linalg.norm([0.3, -0.3, 0.2]))
    _, radius = fit_circle(np.linspace([0, 0], [1, 2], 10))
    assert radius == math.inf


def test_nearly_straight_window_has_huge_radius():
    x = np.linspace(0, 0.2, 15)
    pts = np.stack([x, 1e-7 * np.sin(x * 40), np.zeros_like(x)], axis=1)
    assert curvature_radius_m(pts) > 100.0


def test_standing_still_has_zero_radius_and_displacement():
    pts = np.tile([0.3, 0.0, 0.2], (15, 1))
    assert window_metrics(pts) == (0.0, 0.0)


def test_displacement_ignores_direction():
    back_and_forth = np.array([[0, 0, 0], [0.01, 0, 0], [0, 0, 0], [0.01, 0, 0.0]])
    assert cumulative_displacement_m(back_and_forth) == pytest.approx(0.03)
    assert cumulative_displacement_m(back_and_forth[:1]) == 0.0


def test_bad_input_is_rejected():
    with pytest.raises(ValueError, match="points_m"):
        curvature_radius_m(np.zeros((5, 2)))
    with pytest.raises(ValueError, match=">= 3 points"):
        curvature_radius_m(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="finite"):
        cumulative_displacement_m(np.full((4, 3), np.nan))
