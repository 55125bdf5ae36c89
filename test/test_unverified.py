"""Steps executed without the target VLA: the follow rule, the authors' rule, their bounds."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from heisd_ros.data.observation import EpisodeState
from heisd_ros.decoding.hybrid import HybridConfig, HybridDecoder
from heisd_ros.decoding.retrieval_source import RetrievalSource, RetrievalSourceConfig
from heisd_ros.decoding.unverified import (
    Anchor,
    UnverifiedConfig,
    follow_problem,
    unverified_problem,
)
from heisd_ros.retrieval.records import Candidate, StepRecord
from test.fixtures_decoding import scenes
from test.test_hybrid_helpers import STRAIGHT_FAST, ScriptedClient, ar_bins, ok, router

RS = RetrievalSourceConfig(k=4, deadline_s=0)
LOOSE = UnverifiedConfig(max_run=2, follow_min_similarity=0.95, follow_drift_m=0.005,
                         max_translation_m=1.0, max_rotation_rad=10.0)
STEP_M = np.array([0.02, 0.0, 0.0])   # the demonstration and the arm move 2 cm per step


def point(bins, step: int, score: float = 0.99, episode: int = 7, ahead=()) -> Candidate:
    """Demonstration ``episode``'s point ``step`` (EE at 0.3 m + 2 cm per step along x)."""
    ahead = np.asarray(ahead, dtype=np.int64).reshape(-1, 7)
    record = StepRecord(task="t", episode=episode, step=step, bins=np.asarray(bins, np.int64),
                        action=np.zeros(7), lookahead_bins=ahead,
                        lookahead_actions=np.zeros((len(ahead), 7)),
                        ee_position_m=np.array([0.3, 0.0, 0.2]) + step * STEP_M)
    return Candidate(id=1000 * episode + step, score=score, record=record)


class Loop:
    """A control loop over a hybrid decoder: it keeps the EpisodeState, the arm moves 2 cm."""

    def __init__(self, vla, method: str, config: UnverifiedConfig = LOOSE,
                 threshold: float = 0.0):
        self.answer: list[Candidate] = []
        client = ScriptedClient(lambda _embedding: ok(self.answer))
        self.decoder = HybridDecoder(
            vla, HybridConfig(method=method, skip_threshold=0.999, retrieval=RS,
                              unverified=config),
            retrieval=RetrievalSource(client, vla.actions.vocab_base, RS),
            router=router(threshold))
        self.episode = EpisodeState("t")
        self.observations = scenes(8, seed=31)
        self.decode = self.decoder.decode

    def step(self, answer, extra_m=0.0, execute=True):
        """Decode step ``episode.step_index`` with ``answer`` as the retrieval's candidates."""
        self.answer = list(answer)
        t = self.episode.step_index
        ee = np.array([0.3, 0.0, 0.2]) + t * STEP_M + np.array([extra_m, 0.0, 0.0])
        obs = replace(self.observations[t], episode=self.episode,
                      proprio=np.array([*ee, 0.0, 0.0, 0.0, 0.07], np.float32))
        got = self.decode(obs, ee_positions_m=STRAIGHT_FAST)
        if execute:
            self.episode = self.episode.executed(got.action)
        return got


def first_verified(loop, vla):
    """Step 0: the gripper state is unknown, so the target decides; its action is point 0's."""
    bins = ar_bins(vla, loop.observations[0])
    got = loop.step([point(bins, 0)])
    assert not got.record.verify_skipped and got.stats.target_forwards >= 1
    np.testing.assert_array_equal(got.bins, bins)  # so the loop now follows episode 7
    return bins


def test_follow_runs_the_demonstrations_next_points_then_verifies(tiny_trained_vla):
    vla = tiny_trained_vla
    loop = Loop(vla, "heisd")
    bins = first_verified(loop, vla)
    for t in (1, 2):
        got = loop.step([point(bins, t, score=0.97, episode=3), point(bins, t)])
        rec = got.record
        assert rec.verify_skipped and rec.skip_rule == "follow" and rec.unverified_run == t
        assert got.stats.target_forwards == 0 and got.hidden is None
        assert "episode 7 step" in rec.why
    got = loop.step([point(bins, 3)])  # max_run = 2: the third is verified
    assert not got.record.verify_skipped and got.record.unverified_run == 0
    assert "2 unverified step(s) in a row" in got.record.why


def test_follow_stops_when_the_arm_drifts_or_the_match_is_lost(tiny_trained_vla):
    vla = tiny_trained_vla
    loop = Loop(vla, "heisd")
    bins = first_verified(loop, vla)
    got = loop.step([point(bins, 1)], extra_m=0.03)  # the arm is 3 cm off the demo's step
    assert not got.record.verify_skipped and "drifted 30.0 mm" in got.record.why
    for answer, why in (([point(bins, 2, episode=3)], "are not among the retrieved"),
                        ([point(bins, 2, score=0.9)], "similar, below 0.9500")):
        loop = Loop(vla, "heisd")
        first_verified(loop, vla)
        loop.step([point(bins, 1)])  # follows: run 1 (a point of episode 7 at step 1)
        got = loop.step(answer)
        assert not got.record.verify_skipped and why in got.record.why


def test_follow_verifies_the_approach_to_a_gripper_change(tiny_trained_vla):
    vla = tiny_trained_vla
    loop = Loop(vla, "heisd")
    bins = first_verified(loop, vla)
    closed = vla.codec.decode(bins)[6]
    other = np.array(bins)
    other[6] = next(b for b in (0, 255) if vla.codec.decode(np.r_[bins[:6], b])[6] != closed)
    got = loop.step([point(bins, 1, ahead=[other])])
    assert not got.record.verify_skipped
    assert "the demonstration changes the gripper next" in got.record.why
    loop = Loop(vla, "heisd")
    first_verified(loop, vla)
    got = loop.step([point(other, 1)])  # its own action changes the gripper
    assert not got.record.verify_skipped and "would change the gripper" in got.record.why


def test_a_held_decision_does_not_count_as_executed(tiny_trained_vla):
    vla = tiny_trained_vla
    loop = Loop(vla, "heisd")
    bins = first_verified(loop, vla)
    held = loop.step([point(bins, 1)], execute=False)  # decided, never sent
    again = loop.step([point(bins, 1)])                 # the same step, decided again
    after = loop.step([point(bins, 2)])
    assert [r.record.unverified_run for r in (held, again, after)] == [1, 1, 2]


def test_the_authors_rule_executes_router_steps_two_in_a_row(tiny_trained_vla):
    vla = tiny_trained_vla
    loop = Loop(vla, "heisd_paper")
    bins = first_verified(loop, vla)
    runs = [loop.step([point(bins, 50, score=0.3, episode=9)]).record for _ in range(6)]
    assert [r.unverified_run for r in runs] == [1, 2, 0, 1, 2, 0]
    assert all(r.skip_rule == "router" for r in runs if r.verify_skipped)
    # The router's drafter mode (slow, curved motion): every step verified.
    loop = Loop(vla, "heisd_paper", threshold=0.9)  # F is 0.7 on this history
    first_verified(loop, vla)
    assert not any(loop.step([point(bins, 1)]).record.verify_skipped for _ in range(3))


def test_an_unverified_step_is_marked_in_the_node_messages(tiny_trained_vla):
    from builtin_interfaces.msg import Time
    from heisd_ros.msg import EECommand

    from heisd_ros.nodes.policy_decoders import NodeDecoder
    from heisd_ros.nodes.policy_messages import command_msg, hybrid_step_msg

    vla = tiny_trained_vla
    loop = Loop(vla, "heisd")
    bins = first_verified(loop, vla)
    loop.step([point(bins, 1)])  # the router's window (3 positions) fills from the proprio
    adapter = NodeDecoder(loop.decoder)
    loop.decode = lambda obs, ee_positions_m: adapter.decode(obs)
    step = loop.step([point(bins, 2)])
    msg = hybrid_step_msg(step, 2, Time(), "base_link", "t", True)
    assert msg.verify_skipped and msg.skip_rule == "follow" and msg.unverified_run == 2
    assert msg.target_forwards == 0 and list(msg.action_bins) == list(bins)
    assert command_msg(step, 2, Time(), "base_link").source == EECommand.SOURCE_RETRIEVAL_SKIP
    step = loop.step([point(bins, 3)])  # max_run 2: verified
    msg = hybrid_step_msg(step, 3, Time(), "base_link", "t", True)
    assert not msg.verify_skipped and msg.skip_rule == "" and msg.unverified_run == 0


@pytest.mark.parametrize("method", ["router_only", "router_skip"])
def test_the_ablation_methods_do_not_follow(tiny_trained_vla, method):
    vla = tiny_trained_vla
    loop = Loop(vla, method)
    bins = first_verified(loop, vla)
    assert not loop.step([point(bins, 1)]).record.verify_skipped


# ---------------------------------------------------------------- the bounds, without a model
def test_every_unverified_action_keeps_the_gripper_and_the_driver_bounds():
    cfg = UnverifiedConfig()
    open_state = EpisodeState("t", 3, 0.0)
    small = np.array([0.01, 0.0, 0.0, 0.0, 0.05, 0.0, 0.0])
    assert unverified_problem(small, open_state, 0, 2, cfg) == ""
    assert "in a row" in unverified_problem(small, open_state, 2, 2, cfg)
    assert "unknown" in unverified_problem(small, EpisodeState("t"), 0, 2, cfg)
    assert "unknown" in unverified_problem(small, None, 0, 2, cfg)
    closing = small.copy()
    closing[6] = 1.0
    assert "change the gripper" in unverified_problem(closing, open_state, 0, 2, cfg)
    for index, value, what in ((0, 0.021, "translation 21.0 mm"),
                               (4, 0.16, "rotation 0.160 rad"),
                               (1, np.nan, "translation nan mm")):
        action = small.copy()
        action[index] = value
        assert what in unverified_problem(action, open_state, 0, 2, cfg)


def test_follow_problem_names_each_cause():
    cfg = UnverifiedConfig(follow_min_similarity=0.95, follow_drift_m=0.01)
    bins = np.full(7, 128)
    anchor = Anchor.of(point(bins, 4))
    nxt = point(bins, 5)
    state = EpisodeState("t", 5, 0.0)
    assert follow_problem(anchor, nxt, 0.0, STEP_M, state, cfg) == ""
    assert "no retrieved" in follow_problem(None, nxt, 0.0, STEP_M, state, cfg)
    assert "not among" in follow_problem(anchor, None, 0.0, STEP_M, state, cfg)
    low = point(bins, 5, score=0.5)
    assert "below 0.9500" in follow_problem(anchor, low, 0.0, STEP_M, state, cfg)
    assert "unknown" in follow_problem(anchor, nxt, 0.0, None, state, cfg)
    assert "drifted 15.0 mm" in follow_problem(anchor, nxt, 0.0, STEP_M + [0, 0.015, 0],
                                               state, cfg)
    assert "gripper next" in follow_problem(anchor, nxt, 1.0, STEP_M, state, cfg)
    far, other = point(bins, 6, score=0.995), point(bins, 5, episode=8, score=0.999)
    assert anchor.next_point([other, nxt], 1) is nxt
    assert anchor.next_point([other, nxt, far], 2) is far  # the more similar of the two
    assert anchor.next_point([other, far], 1) is None
    assert anchor.next_point([point(bins, 4), point(bins, 3)], 2) is None  # not ahead
    with pytest.raises(ValueError, match="max_run"):
        UnverifiedConfig(max_run=-1)
    with pytest.raises(ValueError, match="follow_drift_m"):
        UnverifiedConfig(follow_drift_m=float("nan"))
