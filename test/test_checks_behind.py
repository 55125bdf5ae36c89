"""Checks behind (``heisd_behind``): the target verifies each unverified action as it runs."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from heisd_ros.decoding.acceptance import exact_rule
from heisd_ros.decoding.behind import BehindChecker
from heisd_ros.decoding.decoder import ActionDecoder
from heisd_ros.decoding.interface import BEHIND_CONFIRMED, BEHIND_NONE, BEHIND_REJECTED
from heisd_ros.decoding.methods import METHODS
from heisd_ros.decoding.unverified import UnverifiedConfig
from heisd_ros.eval.metrics import checks_summary
from heisd_ros.models.draft_tree import DraftTree
from test.test_unverified import LOOSE, STEP_M, Loop, first_verified, point

BEHIND = replace(LOOSE, behind_max_run=3)


def observation_at(loop: Loop, t: int):
    """The observation ``loop.step`` decodes at step ``t`` (same proprio and episode)."""
    ee = np.array([0.3, 0.0, 0.2]) + t * STEP_M
    return replace(loop.observations[t], episode=loop.episode,
                   proprio=np.array([*ee, 0.0, 0.0, 0.0, 0.07], np.float32))


def target_action(vla, loop: Loop, t: int) -> np.ndarray:
    """The target's own (AR greedy) bins at step ``t``: a check of them confirms."""
    return ActionDecoder(vla).decode(observation_at(loop, t)).bins


def off_action(vla, bins: np.ndarray) -> np.ndarray:
    """``bins`` with the first arm bin 40 away: the sequence-wise rule refuses it (token 15)."""
    other = np.array(bins)
    other[0] = bins[0] + 40 if bins[0] < 200 else bins[0] - 40
    return other


def test_a_confirmed_run_goes_on_up_to_its_bound(tiny_trained_vla):
    vla = tiny_trained_vla
    loop = Loop(vla, "heisd_behind", config=BEHIND)
    first_verified(loop, vla)
    records = []
    for t in range(1, 5):
        got = loop.step([point(target_action(vla, loop, t), t)])
        records.append(got.record)
    runs = [r.unverified_run for r in records]
    assert runs == [1, 2, 3, 0]   # behind_max_run = 3, then verified
    assert [r.checked_behind for r in records] == [True, True, True, False]
    # Each step collected the check of the one before: all confirmed, no bin off.
    assert [r.behind_result for r in records] == [BEHIND_NONE] + [BEHIND_CONFIRMED] * 3
    assert [r.behind_bin_difference for r in records[1:]] == [0, 0, 0]
    assert all(r.behind_check_ms > 0 for r in records[1:])
    assert loop.decoder.checks_started == 3 and loop.decoder.collect_check() is None


def test_a_rejected_check_forces_the_next_step_verified(tiny_trained_vla):
    vla = tiny_trained_vla
    loop = Loop(vla, "heisd_behind", config=BEHIND)
    first_verified(loop, vla)
    wrong = off_action(vla, target_action(vla, loop, 1))
    got = loop.step([point(wrong, 1)])
    assert got.record.verify_skipped and got.record.checked_behind
    np.testing.assert_array_equal(got.bins, wrong)
    # Step 2 would follow the demonstration (its next point matches), but step 1 is rejected.
    after = loop.step([point(target_action(vla, loop, 2), 2)])
    rec = after.record
    assert not rec.verify_skipped and rec.unverified_run == 0 and after.stats.target_forwards
    assert rec.behind_result == BEHIND_REJECTED and rec.behind_bin_difference >= 40
    assert "check behind of step 1 (follow): rejected" in rec.why
    assert "the check behind rejected the last action" in rec.why
    verdict = after.behind
    assert not verdict.confirmed and verdict.first_rejected_dim == 0
    assert verdict.step_index == 1 and verdict.rule == "follow"


def test_the_same_step_under_heisd_runs_unchecked(tiny_trained_vla):
    """The contrast: without checks behind the wrong action is never looked at again."""
    vla = tiny_trained_vla
    loop = Loop(vla, "heisd")
    first_verified(loop, vla)
    loop.step([point(off_action(vla, target_action(vla, loop, 1)), 1)])
    got = loop.step([point(target_action(vla, loop, 2), 2)])
    assert got.record.verify_skipped and got.record.behind_result == BEHIND_NONE
    assert got.behind is None and loop.decoder.collect_check() is None


def test_the_check_sees_the_executed_observation_and_candidate(tiny_trained_vla):
    vla = tiny_trained_vla
    loop = Loop(vla, "heisd_behind", config=BEHIND)
    first_verified(loop, vla)
    executed_obs = observation_at(loop, 1)
    wrong = off_action(vla, target_action(vla, loop, 1))
    wrong[3] = (wrong[3] + 7) % 256   # off in a later dimension too
    got = loop.step([point(wrong, 1)])
    verdict = loop.decoder.collect_check()   # the episode's last step: collected by the loop
    np.testing.assert_array_equal(verdict.candidate_bins, got.bins)

    def teacher_forced(obs):
        state = vla.start(vla.encode(obs), obs.episode.gripper_closed)
        out = vla.forward(state, DraftTree.chain(vla.actions.token_of_bin(got.bins)))
        return vla.target_bins(out, 0, state.gripper_closed)

    np.testing.assert_array_equal(verdict.target_bins, teacher_forced(executed_obs))
    # The next frame gives another answer, so the check could not have used it.
    following = replace(observation_at(loop, 2), episode=executed_obs.episode)
    assert not np.array_equal(teacher_forced(following), teacher_forced(executed_obs))
    assert verdict.bin_difference == int(np.abs(verdict.target_bins - got.bins).sum())


@pytest.mark.parametrize("method", [m for m, s in METHODS.items()
                                    if s.hybrid and not s.checks_behind])
def test_other_hybrid_methods_start_no_check(tiny_trained_vla, method):
    """Hybrid methods without checks behind start none (the rest are plain ActionDecoders)."""
    vla = tiny_trained_vla
    loop = Loop(vla, method)
    bins = first_verified(loop, vla)
    for t in (1, 2):
        rec = loop.step([point(bins, t)]).record
        assert not rec.checked_behind and rec.behind_result == BEHIND_NONE
    assert loop.decoder.checks_started == 0


def test_a_failing_check_reaches_the_step_that_collects_it(tiny_trained_vla):
    vla = tiny_trained_vla
    checker = BehindChecker(vla, exact_rule)
    obs = observation_at(Loop(vla, "heisd_behind"), 0)
    checker.start(vla.encode(obs), None, np.full(8, 3), 0, "follow")   # 8 bins: not an action
    with pytest.raises(ValueError):
        checker.collect()


def test_behind_max_run_is_checked():
    with pytest.raises(ValueError, match="behind_max_run"):
        UnverifiedConfig(behind_max_run=-1)
    assert UnverifiedConfig().overridden(max_run=5).behind_max_run == 5


def _step(skipped, forwards, behind=None, wait_ms=0.0, cpu_ms=10.0):
    hybrid = {"behind_result": 0 if behind is None else 1, "behind_wait_ms": wait_ms}
    return {"verify_skipped": skipped, "target_forwards": forwards, "cpu_ms": cpu_ms,
            "hybrid": hybrid, **({"behind": behind} if behind else {})}


def test_checks_summary_counts_who_checked_each_action():
    ok = {"confirmed": True, "rule": "follow", "bin_difference": 0, "cpu_ms": 20.0,
          "first_rejected_dim": -1}
    bad = {"confirmed": False, "rule": "similarity", "bin_difference": 44, "cpu_ms": 20.0,
           "first_rejected_dim": 6}
    episodes = [[_step(False, 7), _step(True, 0, ok, wait_ms=3.0), _step(True, 0, bad)],
                [_step(False, 2), _step(True, 0)]]          # the last one never checked
    c = checks_summary(episodes)
    checks = c["checks"]
    assert (checks["actions"], checks["verified_before"], checks["checked_behind"],
            checks["unchecked"]) == (5, 2, 2, 1)
    assert checks["checked_share"] == pytest.approx(0.8)
    assert checks["behind_rejection_rate"] == pytest.approx(0.5)
    assert checks["behind_by_rule"]["similarity"] == {"checks": 1, "rejected": 1,
                                                      "rejection_rate": 1.0}
    assert checks["rejected_bin_difference"] == {"mean": 44.0, "max": 44}
    assert checks["rejected_at"] == {"position": 0, "rotation": 0, "gripper": 1}
    assert checks["waited"] == 1 and checks["wait_ms_mean"] == pytest.approx(3.0)
    assert c["vla_forwards_per_action"] == pytest.approx((7 + 1 + 1 + 2 + 0) / 5)
    assert c["cpu_ms_per_action"] == pytest.approx((10 * 5 + 40) / 5)


def test_checked_behind_the_routers_threshold_does_not_gate_unverified_steps(tiny_trained_vla):
    vla = tiny_trained_vla
    for gate, skipped in ((False, True), (True, False)):
        config = replace(BEHIND, behind_router_gate=gate)
        loop = Loop(vla, "heisd_behind", config=config, threshold=0.9)  # F is 0.7 here
        first_verified(loop, vla)
        got = loop.step([point(target_action(vla, loop, 1), 1)])
        assert got.record.router_mode == 0   # the router's drafter mode, either way
        assert got.record.verify_skipped is skipped, got.record.why
