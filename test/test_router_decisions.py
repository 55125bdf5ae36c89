"""Kinematic router: statistics per suite, fused metric and routing decisions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from heisd_ros.kinematics.router import (
    MODE_DRAFTER,
    MODE_RETRIEVAL,
    KinematicRouter,
    RouterConfig,
    RouterStats,
)


def line(n, step_m, direction=(1.0, 0.5, -0.2), start=(0.3, 0.0, 0.2)):
    d = np.asarray(direction) / np.linalg.norm(direction)
    return np.asarray(start) + np.outer(np.arange(n) * step_m, d)


def circle(n, radius_m, step_m, centre=(0.4, 0.1, 0.25)):
    t = np.arange(n) * step_m / radius_m
    return np.asarray(centre) + np.stack([radius_m * np.cos(t), np.zeros(n),
                                          radius_m * np.sin(t)], axis=1)


def demo_trajectories(seed=0):
    """Demonstration-like paths: fast transfers, medium arcs, slow fine motion near contact."""
    rng = np.random.default_rng(seed)
    trajs = []
    for _ in range(8):
        trajs.append(line(40, rng.uniform(0.008, 0.015), direction=rng.normal(size=3)))
        trajs.append(circle(40, rng.uniform(0.1, 0.6), rng.uniform(0.004, 0.01)))
        trajs.append(circle(40, rng.uniform(0.01, 0.03), rng.uniform(0.0005, 0.002)))
    return [t + rng.normal(scale=1e-4, size=t.shape) for t in trajs]


@pytest.fixture(scope="module")
def stats():
    return RouterStats.fit(demo_trajectories(), window=15, suite="synthetic")


def test_stats_clip_at_percentile(stats):
    assert stats.n_windows == 24 * 26 and stats.suite == "synthetic"
    assert 0.0 <= stats.radius_lo_m < 0.05 and math.isfinite(stats.radius_hi_m)
    assert 0.0 < stats.displacement_lo_m < 0.05 < stats.displacement_hi_m
    assert stats.norm_radius(math.inf) == 1.0 and stats.norm_radius(0.0) == 0.0
    assert stats.norm_displacement(10.0) == 1.0


def test_fast_straight_line_goes_to_retrieval(stats):
    decision = KinematicRouter(RouterConfig(), stats).decide(line(30, 0.012))
    assert decision.mode == MODE_RETRIEVAL
    assert decision.radius_m > stats.radius_hi_m and decision.norm_radius == 1.0
    assert decision.displacement_m == pytest.approx(14 * 0.012)
    assert decision.fused > 0.8 and decision.n_points == 15
    assert decision.fused == pytest.approx(0.5 * decision.norm_radius
                                           + 0.5 * decision.norm_displacement)


def test_slow_small_circle_goes_to_drafter(stats):
    decision = KinematicRouter(RouterConfig(), stats).decide(circle(15, 0.02, 0.001))
    assert decision.mode == MODE_DRAFTER
    assert decision.radius_m == pytest.approx(0.02, rel=1e-3)
    assert decision.fused < 0.2


def test_threshold_and_alpha_are_respected(stats):
    medium = circle(15, 0.3, 0.006)
    f = KinematicRouter(RouterConfig(), stats).decide(medium).fused
    assert 0.0 < f < 1.0
    assert KinematicRouter(RouterConfig(threshold=f), stats).decide(medium).mode == MODE_RETRIEVAL
    above = RouterConfig(threshold=min(1.0, f + 1e-6))
    assert KinematicRouter(above, stats).decide(medium).mode == MODE_DRAFTER
    only_d = KinematicRouter(RouterConfig(alpha=0.0), stats).decide(medium)
    assert only_d.fused == pytest.approx(only_d.norm_displacement)


def test_too_few_points_go_to_drafter(stats):
    router = KinematicRouter(RouterConfig(), stats)
    decision = router.decide(line(14, 0.02))
    assert decision.mode == MODE_DRAFTER and math.isnan(decision.fused)
    assert decision.n_points == 14 and decision.threshold == 0.5
    assert router.decide(np.zeros((0, 3))).mode == MODE_DRAFTER
    short_ok = KinematicRouter(RouterConfig(min_points=5), stats).decide(line(6, 0.05))
    assert short_ok.n_points == 6 and not math.isnan(short_ok.fused)


def test_stats_save_load_round_trip(stats, tmp_path):
    path = tmp_path / "router_stats.json"
    stats.save(path)
    assert RouterStats.load(path) == stats
    path.write_text('{"radius_lo_m": 0.0}')
    with pytest.raises(ValueError, match="not a RouterStats file"):
        RouterStats.load(path)


def test_window_mismatch_is_rejected(stats):
    with pytest.raises(ValueError, match="stats.window"):
        KinematicRouter(RouterConfig(window=10), stats)


@pytest.mark.parametrize("kwargs, field", [
    (dict(alpha=1.5), "alpha"), (dict(window=2), "window"), (dict(threshold=-0.1), "threshold"),
    (dict(threshold=float("nan")), "threshold"), (dict(min_points=20), "min_points"),
])
def test_config_errors(kwargs, field):
    with pytest.raises(ValueError, match=field):
        RouterConfig(**kwargs)


def test_fit_needs_windows():
    with pytest.raises(ValueError, match="need >= 2 windows"):
        RouterStats.fit([line(10, 0.01)], window=15)
    with pytest.raises(ValueError, match="radius_lo_m"):
        RouterStats(0.5, 0.1, 0.0, 1.0, window=15)


def test_fused_series_matches_step_by_step_decisions(stats):
    router = KinematicRouter(RouterConfig(), stats)
    traj = np.concatenate([line(20, 0.012), circle(20, 0.02, 0.001, centre=(0.6, 0.0, 0.3))])
    series = router.fused_series(traj)
    assert series.shape == (40,) and np.isnan(series[:14]).all()
    for t in (14, 25, 39):
        assert series[t] == router.decide(traj[:t + 1]).fused
    assert series[19] > 0.8 > 0.2 > series[39]  # straight and fast, then slow and curved
