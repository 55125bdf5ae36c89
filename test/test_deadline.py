"""``heisd_deadline``: a verified step stops at its forward budget and is checked behind."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from heisd_ros.decoding.behind import check_action
from heisd_ros.decoding.deadline import predicted_tail
from heisd_ros.decoding.interface import (
    BEHIND_CONFIRMED,
    BEHIND_NONE,
    BEHIND_REJECTED,
    DRAFT_RETRIEVAL,
)
from heisd_ros.decoding.unverified import UnverifiedConfig
from heisd_ros.eval.metrics import checks_summary
from heisd_ros.latency.counters import DecisionCounters
from heisd_ros.latency.pricing import DeviceTimeline, price
from heisd_ros.latency.profile import load_profile
from test.test_checks_behind import BEHIND, observation_at, target_action
from test.test_hybrid_helpers import STRAIGHT_FAST, ar_bins
from test.test_unverified import Loop, first_verified, point


def shifted(bins, *dims, by: int = 40) -> np.ndarray:
    """``bins`` with each of ``dims`` ``by`` bins away (the sequence-wise rule refuses 15+)."""
    out = np.array(bins)
    for d in dims:
        out[d] = bins[d] + by if bins[d] < 256 - by else bins[d] - by
    return out


def other_demo(bins, t: int):
    """A candidate from a demonstration the loop does not follow: the step is verified."""
    return point(bins, t, score=0.97, episode=3)


def complete_one(vla, draft_dims, by):
    """A loop's step 1 with one draft: the target's own action, ``draft_dims`` ``by`` off."""
    loop = Loop(vla, "heisd_deadline", config=BEHIND)
    first_verified(loop, vla)
    own = target_action(vla, loop, 1)
    return loop, own, loop.step([other_demo(shifted(own, *draft_dims, by=by), 1)])


def test_an_action_incomplete_at_the_budget_is_completed_and_checked_from_its_cache(
        tiny_trained_vla):
    vla = tiny_trained_vla
    # The draft is the target's own action but 20 bins off at position 3 (roll): the prefill
    # accepts the position group (0-2), the target says 3, and 4-6 are its predictions along
    # the draft (conditioned on the drafted roll), unverified.
    loop, own, got = complete_one(vla, (3,), 20)
    rec, stats = got.record, got.stats
    assert stats.target_forwards == 1 and stats.completed_tokens == 3, rec.why
    assert rec.skip_rule == "deadline" and rec.checked_behind and not rec.verify_skipped
    assert rec.unverified_run == 1 and got.hidden is None
    assert stats.check_tokens == (1, 3) and stats.check_from_cache
    assert "4 token(s) verified, 3 predicted along the draft" in rec.why
    np.testing.assert_array_equal(got.bins[:4], own[:4])

    verdict = loop.decoder.collect_check()
    assert verdict.rule == "deadline" and verdict.step_index == 1
    np.testing.assert_array_equal(verdict.candidate_bins, got.bins)
    # The check from the step's cache says what a fresh check of the whole action says.
    obs = observation_at(loop, 1)
    fresh = check_action(vla, vla.start(vla.encode(obs), obs.episode.gripper_closed),
                         got.bins, loop.decoder._retrieval_rule)
    np.testing.assert_array_equal(verdict.target_bins[4:], fresh.target_bins[4:])
    np.testing.assert_array_equal(verdict.target_bins[:4], got.bins[:4])
    assert verdict.confirmed == fresh.confirmed
    # Here the predictions were the target's own action: confirmed.
    np.testing.assert_array_equal(got.bins, own)
    assert verdict.confirmed


def test_a_wrong_completion_is_rejected_and_the_next_step_fully_verified(tiny_trained_vla):
    vla = tiny_trained_vla
    loop, own, got = complete_one(vla, (3,), 40)   # conditioned on a roll 40 bins off
    assert got.stats.completed_tokens == 3
    assert not np.array_equal(got.bins, own), "the fixture's completion is right: pick another"
    after = loop.step([other_demo(shifted(target_action(vla, loop, 2), 3, by=20), 2)])
    rec = after.record
    assert rec.behind_result == BEHIND_REJECTED and after.behind.first_rejected_dim == 4
    assert "no completion at the deadline: the check behind rejected" in rec.why
    assert after.stats.completed_tokens == 0 and after.stats.target_forwards > 1
    assert rec.skip_rule == "" and rec.unverified_run == 0 and not rec.checked_behind
    np.testing.assert_array_equal(after.bins, target_action(vla, loop, 2))


def test_a_completion_that_would_change_the_gripper_is_verified_instead(tiny_trained_vla):
    vla = tiny_trained_vla
    # Conditioned on a yaw 16 bins off, the target predicts the other gripper state.
    loop, own, got = complete_one(vla, (5,), 16)
    assert got.stats.completed_tokens == 0 and got.stats.target_forwards > 1
    assert "verify (deadline): the action would change the gripper" in got.record.why
    assert got.record.behind_result == BEHIND_NONE and loop.decoder.checks_started == 0
    np.testing.assert_array_equal(got.bins, own)


@pytest.mark.parametrize("seed", [0, 1])
def test_with_a_budget_it_never_reaches_it_decodes_as_heisd_behind(tiny_trained_vla, seed):
    """The property: with the router's window full, only the budget differs from heisd_behind."""
    vla = tiny_trained_vla
    rng = np.random.default_rng(seed)
    loops = [Loop(vla, "heisd_behind", config=BEHIND),
             Loop(vla, "heisd_deadline", config=replace(BEHIND, deadline_forwards=7))]
    for loop in loops:
        first_verified(loop, vla)
    for t in range(1, 5):
        own = target_action(vla, loops[0], t)
        answer = [other_demo(shifted(own, *rng.choice(7, 2, replace=False)), t),
                  point(own, t)]
        got = [loop.step(list(answer)) for loop in loops]
        np.testing.assert_array_equal(got[0].bins, got[1].bins)
        assert got[0].stats.forward_tokens == got[1].stats.forward_tokens
        assert got[0].record.skip_rule == got[1].record.skip_rule
        assert got[1].stats.completed_tokens == 0


def test_the_deadline_check_is_priced_as_one_decode_forward():
    profile = load_profile("openvla-7b-paper")
    counters = DecisionCounters(vision=1, forwards=((280, 35),), draft_calls=1, retrievals=1,
                                check=(1, 4), check_from_cache=True)
    priced = price(counters, profile)
    assert priced.check_ms == pytest.approx(profile.forward_ms(1, 4))
    assert priced.total_ms == pytest.approx(
        profile.vision_ms + profile.prefill_ms(280, 35) + profile.retrieval_ms
        + profile.overhead_ms)
    assert priced.total_ms < 100.0 < priced.total_ms + profile.forward_ms(1, 4) + 1.0
    # The next decision waits for exactly the rest of that check.
    timeline = DeviceTimeline(profile)
    first = timeline.decide(0.0, counters)
    second = timeline.decide(0.1, DecisionCounters(vision=1, forwards=((280, 0),)))
    end_of_check_ms = first.latency_ms + priced.check_ms
    assert second.wait_ms == pytest.approx(end_of_check_ms - 100.0)
    assert DecisionCounters.from_dict(counters.to_dict()) == counters


def test_checks_summary_counts_a_completed_step_as_checked_behind():
    ok = {"confirmed": True, "rule": "deadline", "bin_difference": 0, "cpu_ms": 5.0,
          "first_rejected_dim": -1}

    def step(skipped, rule="", behind=None):
        hybrid = {"behind_result": 0, "behind_wait_ms": 0.0, "skip_rule": rule}
        return {"verify_skipped": skipped, "target_forwards": 0 if skipped else 1,
                "cpu_ms": 1.0, "hybrid": hybrid, **({"behind": behind} if behind else {})}

    episodes = [[step(False), step(False, "deadline", ok),
                 step(True, "follow", {**ok, "rule": "follow"}),
                 step(False, "deadline")]]   # the last one's check never came back
    checks = checks_summary(episodes)["checks"]
    assert (checks["verified_before"], checks["checked_behind"],
            checks["completed_at_deadline"], checks["unchecked"]) == (1, 2, 2, 1)
    assert checks["checked_share"] == pytest.approx(0.75)
    assert checks["behind_by_rule"]["deadline"]["checks"] == 1


def test_the_tail_follows_the_drafted_child_nearest_each_prediction():
    # dims: root 0 (accepted), then two drafted children at 1 (bins 10, 50), each with a chain
    # below; target_bins[i] is the target's bin at node i, from its parent's output.
    parents = [-1, 0, 0, 1, 3, 2, 5]
    draft = [5, 10, 50, 30, 40, 31, 41]
    target = [5, 48, 48, 31, 33, 31, 39]
    assert predicted_tail(parents, draft, target, [0], bonus_bin=48, needed=2) == [31, 39]
    assert predicted_tail(parents, draft, target, [0], bonus_bin=11, needed=2) == [31, 33]
    assert predicted_tail(parents, draft, target, [0], bonus_bin=48, needed=3) is None
    # Nothing accepted: the roots are the children of -1.
    assert predicted_tail(parents, draft, target, [], bonus_bin=5, needed=1) == [48]
    # Ties go to the lower node index (the higher-ranked draft).
    assert predicted_tail(parents, draft, target, [0], bonus_bin=30, needed=1) == [31]


def test_deadline_forwards_is_checked():
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="deadline_forwards"):
            UnverifiedConfig(deadline_forwards=bad)


def test_a_completion_counts_towards_the_run_bound(tiny_trained_vla):
    vla = tiny_trained_vla
    loop = Loop(vla, "heisd_deadline", config=replace(BEHIND, behind_max_run=1))
    first_verified(loop, vla)
    got = loop.step([other_demo(shifted(target_action(vla, loop, 1), 3, by=20), 1)])
    assert got.stats.completed_tokens == 3 and got.record.unverified_run == 1
    after = loop.step([other_demo(shifted(target_action(vla, loop, 2), 3, by=20), 2)])
    assert after.record.behind_result == BEHIND_CONFIRMED
    assert "verify (deadline): 1 unverified step(s) in a row" in after.record.why
    assert after.stats.completed_tokens == 0 and after.record.unverified_run == 0


def test_a_completed_step_is_marked_not_verified_in_the_node_messages(tiny_trained_vla):
    from builtin_interfaces.msg import Time
    from heisd_ros.msg import EECommand

    from heisd_ros.nodes.policy_decoders import NodeDecoder
    from heisd_ros.nodes.policy_messages import command_msg, hybrid_step_msg

    vla = tiny_trained_vla
    loop = Loop(vla, "heisd_deadline", config=BEHIND)
    first_verified(loop, vla)
    loop.step([point(target_action(vla, loop, 1), 1)])  # the router's window fills (proprio)
    adapter = NodeDecoder(loop.decoder)
    loop.decode = lambda obs, ee_positions_m: adapter.decode(obs)
    step = loop.step([other_demo(shifted(target_action(vla, loop, 2), 3, by=20), 2)])
    msg = hybrid_step_msg(step, 2, Time(), "base_link", "t", True)
    assert msg.skip_rule == "deadline" and msg.checked_behind and not msg.verify_skipped, msg.why
    assert msg.target_forwards == 1 and msg.unverified_run == 2
    command = command_msg(step, 2, Time(), "base_link")
    assert command.source == EECommand.SOURCE_RETRIEVAL_SKIP and not command.gripper_from_target


def test_before_the_routers_window_is_full_it_drafts_from_retrieval_exactly(tiny_trained_vla):
    """Before the router's window is full, heisd_deadline drafts from retrieval, exactly.

    At an episode's start (too short a window for the router) ``heisd_behind`` decodes with
    the drafter or AR, several target forwards; ``heisd_deadline`` puts the retrieval draft in
    the prefill (one forward when the retrieved action is the target's) and accepts it only
    where it equals the target's greedy tokens; nothing runs unverified.
    """
    vla = tiny_trained_vla
    short = STRAIGHT_FAST[:1]
    loops = {m: Loop(vla, m, config=BEHIND) for m in ("heisd_behind", "heisd_deadline")}
    for method, loop in loops.items():
        own = ar_bins(vla, loop.observations[0])
        loop.answer = [point(own, 0)]
        got = loop.decode(observation_at(loop, 0), ee_positions_m=short)
        rec = got.record
        assert not rec.verify_skipped and rec.unverified_run == 0, rec.why
        np.testing.assert_array_equal(got.bins, own)
        if method == "heisd_behind":
            assert rec.retrieval_calls == 0 and rec.draft_source != DRAFT_RETRIEVAL
            assert got.stats.target_forwards > 1
        else:
            assert rec.retrieval_calls == 1 and rec.draft_source == DRAFT_RETRIEVAL
            assert got.stats.target_forwards == 1
            assert "retrieval drafts, verified exactly" in rec.why


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_before_the_routers_window_is_full_no_draft_token_is_relaxed(tiny_trained_vla, seed):
    """The property: with too short a window, no retrieval token is accepted by tolerance.

    The drafts are a few bins off the target (within the relaxed rule's tolerances, which
    accept them once the window is full). The action's tokens up to and including the
    target's own token at the first refused position are AR's; any after it are completed
    at the deadline and checked behind.
    """
    vla = tiny_trained_vla
    rng = np.random.default_rng(seed)
    loop = Loop(vla, "heisd_deadline", config=BEHIND)
    first_verified(loop, vla)
    for t in range(1, 4):
        target = target_action(vla, loop, t)
        near = np.array(target)
        dims = rng.choice(6, 2, replace=False)
        near[dims] = np.clip(near[dims] + rng.choice([-3, 3], 2), 0, 255)
        loop.answer = [other_demo(near, t)]
        got = loop.decode(observation_at(loop, t), ee_positions_m=STRAIGHT_FAST[:1])
        rec, completed = got.record, got.stats.completed_tokens
        assert rec.draft_source == DRAFT_RETRIEVAL and not rec.verify_skipped, rec.why
        verified = 7 - completed
        assert verified >= min(dims) + 1, rec.why
        np.testing.assert_array_equal(got.bins[:verified], target[:verified])
        assert bool(completed) == rec.checked_behind == (rec.skip_rule == "deadline")
        loop.decoder.collect_check()
        loop.episode = loop.episode.executed(got.action)
