"""Hybrid decoder: lossless without relaxation/skip on every route, costs, skip, degradation."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from heisd_ros.data.observation import EpisodeState
from heisd_ros.decoding.acceptance import VerifyView
from heisd_ros.decoding.decoder import ActionDecoder
from heisd_ros.decoding.drafter_source import DrafterSource
from heisd_ros.decoding.hybrid import (
    DRAFT_DRAFTER,
    DRAFT_NONE,
    DRAFT_RETRIEVAL,
    ROUTER_DRAFTER,
    ROUTER_OFF,
    ROUTER_RETRIEVAL,
    HybridConfig,
    HybridDecoder,
    build_hybrid_decoder,
    gripper_safe,
)
from heisd_ros.decoding.retrieval_source import RetrievalSource, RetrievalSourceConfig
from heisd_ros.models.draft_tree import DraftTree
from heisd_ros.retrieval.errors import RetrievalStatus
from heisd_ros.retrieval.retriever import RetrievalResult
from test.fixtures_decoding import scenes
from test.polling import ManualClock
from test.test_hybrid_helpers import (
    STANDING,
    STRAIGHT_FAST,
    ScriptedClient,
    ar_bins,
    candidate,
    ok,
    raising,
    router,
)

N_OBS = 4
RS = RetrievalSourceConfig(deadline_s=0.5)


def perfect_client(vla):
    """Top-1 = the AR action (looked up by embedding), then noisy ones."""
    table = {}

    def make(embedding):
        key = np.round(embedding, 5).tobytes()
        bins = table[key]
        noisy = np.clip(bins + np.array([3, -2, 1, 0, 4, -1, 0]), 0, 255)
        return ok([candidate(bins, 0.995, 1), candidate(noisy, 0.97, 2)])

    def register(obs):
        prefix = vla.encode(obs)
        from heisd_ros.retrieval.embedding import embedding_from_features

        table[np.round(embedding_from_features(prefix.vision_features), 5).tobytes()] = \
            ar_bins(vla, obs)

    return ScriptedClient(make), register


def noisy_client(seed=0):
    rng = np.random.default_rng(seed)
    return ScriptedClient(lambda e: ok([candidate(rng.integers(0, 256, 7), 0.9, i)
                                        for i in range(3)]))


def empty_client(_e):
    return RetrievalResult(RetrievalStatus.EMPTY, "no points")


ROUTES = {  # name -> (client factory, router threshold, ee history, uses drafter)
    "retrieval-perfect": ("perfect", 0.0, STRAIGHT_FAST, True),
    "retrieval-noisy": ("noisy", 0.0, STRAIGHT_FAST, True),
    "retrieval-noisy-no-drafter": ("noisy", 0.0, STRAIGHT_FAST, False),
    "drafter-low-F": ("noisy", 1.0, STANDING, True),
    "drafter-short-history": ("noisy", 0.0, STRAIGHT_FAST[:1], True),
    "retrieval-raises": ("raise", 0.0, STRAIGHT_FAST, True),
    "retrieval-empty": ("empty", 0.0, STRAIGHT_FAST, True),
    "retrieval-empty-no-drafter": ("empty", 0.0, STRAIGHT_FAST, False),
}


def make_client(kind, vla, observations):
    if kind == "perfect":
        client, register = perfect_client(vla)
        for obs in observations:
            register(obs)
        return client
    if kind == "noisy":
        return noisy_client()
    return ScriptedClient(raising if kind == "raise" else empty_client)


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_router_only_is_lossless_on_every_route(tiny_vla, tiny_drafter, route):
    kind, threshold, history, with_drafter = ROUTES[route]
    observations = scenes(N_OBS, seed=11)
    client = make_client(kind, tiny_vla, observations)
    hybrid = HybridDecoder(
        tiny_vla, HybridConfig(method="router_only", retrieval=RS),
        drafter=DrafterSource(tiny_drafter, tiny_vla) if with_drafter else None,
        retrieval=RetrievalSource(client, tiny_vla.actions.vocab_base, RS),
        router=router(threshold))
    ar = ActionDecoder(tiny_vla)
    for obs in observations:
        got = hybrid.decode(obs, ee_positions_m=history)
        np.testing.assert_array_equal(got.tokens, ar.decode(obs).tokens)
        rec = got.record
        assert not rec.verify_skipped and rec.target_forwards == got.stats.target_forwards
        if route.startswith("drafter"):
            assert rec.router_mode == ROUTER_DRAFTER and rec.retrieval_calls == 0
        else:
            assert rec.router_mode == ROUTER_RETRIEVAL and rec.retrieval_calls == 1
        if kind in ("raise", "empty"):
            # the drafter's route: the draft head or AR, whichever is measured cheaper here
            by_head = "drafter-routed step by drafter" in rec.why
            assert rec.status and rec.draft_source == (DRAFT_DRAFTER if by_head else DRAFT_NONE)
            assert with_drafter or not by_head
            # the status names what decoded: drafter mode that ran AR says so
            assert rec.status.endswith("(decoded by AR, measured cheaper here)") == (
                with_drafter and not by_head), rec.status
        if kind == "perfect":
            assert rec.target_forwards == 1 and rec.accepted_tokens == 7
            assert rec.draft_source == DRAFT_RETRIEVAL and rec.accepted_length_per_round == [7]


@pytest.mark.parametrize("route", ["drafter-low-F", "drafter-short-history", "retrieval-noisy",
                                   "retrieval-perfect"])
def test_heisd_ar_never_runs_the_draft_head(tiny_vla, tiny_drafter, route):
    kind, threshold, history, _ = ROUTES[route]
    observations = scenes(N_OBS, seed=13)
    # A head is passed but the method does not use it: AR takes its place.
    hybrid = HybridDecoder(
        tiny_vla, HybridConfig(method="heisd_ar", retrieval=RS),
        drafter=DrafterSource(tiny_drafter, tiny_vla),
        retrieval=RetrievalSource(make_client(kind, tiny_vla, observations),
                                  tiny_vla.actions.vocab_base, RS), router=router(threshold))
    ar = ActionDecoder(tiny_vla)
    for obs in observations:
        got = hybrid.decode(obs, ee_positions_m=history)
        assert got.stats.drafter_forwards == 0 and got.record.draft_source != DRAFT_DRAFTER
        if route == "drafter-short-history":   # no retrieval draft either: AR steps
            assert got.record.router_mode == ROUTER_DRAFTER and got.record.retrieval_calls == 0
            np.testing.assert_array_equal(got.tokens, ar.decode(obs).tokens)
            assert got.stats.target_forwards == 7
        if route == "drafter-low-F":   # drafted from retrieval, never unverified
            assert got.record.router_mode == ROUTER_DRAFTER and got.record.retrieval_calls == 1
            assert not got.record.verify_skipped and got.stats.target_forwards >= 1
        if route == "retrieval-perfect" and not got.record.verify_skipped:
            assert got.stats.target_forwards == 1


@pytest.mark.parametrize("method", ["ar", "drafter", "retrieval"])
def test_non_router_methods_are_lossless(tiny_vla, tiny_drafter, method):
    hybrid = HybridDecoder(tiny_vla, HybridConfig(method=method, retrieval=RS),
                           drafter=DrafterSource(tiny_drafter, tiny_vla),
                           retrieval=RetrievalSource(noisy_client(1),
                                                     tiny_vla.actions.vocab_base, RS))
    ar = ActionDecoder(tiny_vla)
    for obs in scenes(N_OBS, seed=12):
        got = hybrid.decode(obs)
        np.testing.assert_array_equal(got.tokens, ar.decode(obs).tokens)
        assert got.record.router_mode == ROUTER_OFF
    if method == "ar":
        assert got.stats.target_forwards == 7


def test_skip_costs_zero_forwards_and_keeps_the_gripper(tiny_trained_vla):
    vla = tiny_trained_vla
    observations = scenes(3, seed=13)
    client = make_client("perfect", vla, observations)
    hybrid = HybridDecoder(vla, HybridConfig(method="router_skip", skip_threshold=0.99,
                                             retrieval=RS),
                           retrieval=RetrievalSource(client, vla.actions.vocab_base, RS),
                           router=router(0.0))
    first = hybrid.decode(replace(observations[0], episode=EpisodeState()),
                          ee_positions_m=STRAIGHT_FAST)
    assert not first.record.verify_skipped          # gripper state unknown at the first step
    assert first.record.target_forwards == 1        # perfect draft verified in the prefill
    for t, obs in enumerate(observations[1:], 1):
        want = ar_bins(vla, obs)
        kept = float(vla.codec.decode(want)[6])     # the draft's gripper (the perfect draft = AR)
        # The robot has the draft's gripper state: executed without a target forward.
        got = hybrid.decode(replace(obs, episode=EpisodeState(None, t, kept)),
                            ee_positions_m=STRAIGHT_FAST)
        assert got.record.verify_skipped and got.stats.target_forwards == 0
        assert got.hidden is None and got.vision_features is not None
        assert got.record.skip_similarity == pytest.approx(0.995)
        np.testing.assert_array_equal(got.bins, want)
        # The draft would change the gripper, or its state is unknown: verified.
        for episode in (EpisodeState(None, t, 1.0 - kept), None):
            got = hybrid.decode(replace(obs, episode=episode), ee_positions_m=STRAIGHT_FAST)
            assert not got.record.verify_skipped and got.stats.target_forwards >= 1
            assert "the gripper" in got.record.why and "verify (similarity)" in got.record.why


@pytest.mark.parametrize("method", ["heisd", "heisd_ar", "router_skip", "heisd_paper"])
def test_low_f_steps_are_never_unverified(tiny_trained_vla, tiny_drafter, method):
    """Below the router's threshold nothing runs unverified, whatever the retrieval says.

    ``heisd`` and ``heisd_ar`` still draft such a step from retrieval (verified: one target
    forward when the retrieved action is the target's), the paper's ladder does not query the
    DB there; with too short a window no method queries it.
    """
    vla = tiny_trained_vla
    observations = scenes(3, seed=15)
    client = make_client("perfect", vla, observations)
    hybrid = HybridDecoder(vla, HybridConfig(method=method, skip_threshold=0.9, retrieval=RS),
                           drafter=DrafterSource(tiny_drafter, vla),
                           retrieval=RetrievalSource(client, vla.actions.vocab_base, RS),
                           router=router(0.5))
    drafts_when_slow = method in ("heisd", "heisd_ar")
    episode = EpisodeState()
    for obs in observations:
        want = ar_bins(vla, obs)
        # The robot holds the retrieved action's gripper: only the router can keep it verified.
        episode = EpisodeState(None, episode.step_index + 1, float(vla.codec.decode(want)[6]))
        got = hybrid.decode(replace(obs, episode=episode), ee_positions_m=STANDING)
        rec = got.record
        assert rec.router_mode == ROUTER_DRAFTER and not rec.verify_skipped
        np.testing.assert_array_equal(got.bins, want)
        if drafts_when_slow:
            assert rec.retrieval_calls == 1 and rec.draft_source == DRAFT_RETRIEVAL
            assert rec.target_forwards == 1 and "retrieval drafts, verified" in rec.why
        else:
            assert rec.retrieval_calls == 0 and rec.draft_source != DRAFT_RETRIEVAL
        short = hybrid.decode(replace(obs, episode=episode), ee_positions_m=STANDING[:1])
        assert short.record.retrieval_calls == 0 and not short.record.verify_skipped
    # The same frames on a fast, straight stretch: the high similarity runs them unverified.
    fast = hybrid.decode(replace(observations[-1], episode=episode),
                         ee_positions_m=STRAIGHT_FAST)
    assert fast.record.router_mode == ROUTER_RETRIEVAL and fast.record.verify_skipped


def _target_gripper_bin(vla, obs, tokens6) -> int:
    """The target's greedy gripper bin after the 6 committed tokens (teacher forcing)."""
    state = vla.start(vla.encode(obs))
    out = vla.forward(state, DraftTree.chain(tokens6))
    return int(vla.actions.argmax_bin(out.tree_logits[5]))


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(bins=st.lists(st.lists(st.integers(0, 255), min_size=7, max_size=7), min_size=1,
                     max_size=3),
       gripper=st.sampled_from([0, 255]), steps=st.integers(0, 1))
def test_gripper_never_changes_without_verification(tiny_trained_vla, bins, gripper,
                                                    steps):
    vla = tiny_trained_vla
    cands = [candidate(b, 0.999 - 0.001 * i, i) for i, b in enumerate(bins)]
    cands[0].record.bins[6] = gripper
    hybrid = HybridDecoder(vla, HybridConfig(method="heisd", skip_threshold=0.9, retrieval=RS),
                           retrieval=RetrievalSource(ScriptedClient(lambda e: ok(cands)),
                                                     vla.actions.vocab_base, RS),
                           router=router(0.0))
    previous, episode = None, EpisodeState()  # the loop's bookkeeping: every action executed
    for obs in scenes(2 + steps, seed=14)[:2]:
        got = hybrid.decode(replace(obs, episode=episode), ee_positions_m=STRAIGHT_FAST)
        if got.record.verify_skipped:
            assert previous is not None and got.action[6] == previous
        else:
            assert got.bins[6] == _target_gripper_bin(vla, obs, got.tokens[:6])
        previous, episode = got.action[6], episode.executed(got.action)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_gripper_safe_rule_cuts_at_a_changed_gripper(data):
    n = data.draw(st.integers(1, 7))
    draft = np.array(data.draw(st.lists(st.integers(0, 255), min_size=n, max_size=n)))
    target = np.array(data.draw(st.lists(st.integers(0, 255), min_size=n, max_size=n)))
    view = VerifyView(parents=np.arange(n) - 1, draft_bins=draft, target_bins=target,
                      dims=np.arange(7 - n, 7))
    path = gripper_safe(lambda v: list(range(n)))(view)  # a rule that accepts everything
    for node in path:
        assert view.dims[node] != 6 or draft[node] == target[node]


@pytest.mark.parametrize("kind", ["raise", "slow", "empty", "error", "garbage", "absent"])
def test_degradation_never_raises(tiny_random_vla, tiny_drafter, kind):
    vla = tiny_random_vla
    clock = ManualClock()  # the slow answer takes 30 ms of it, against a 5 ms deadline
    clients = {"raise": ScriptedClient(raising),
               "slow": ScriptedClient(lambda e: ok([candidate([1] * 7)]), delay=(clock, 0.03)),
               "empty": ScriptedClient(empty_client),
               "error": ScriptedClient(lambda e: RetrievalResult(RetrievalStatus.ERROR, "down")),
               "garbage": ScriptedClient(lambda e: object()), "absent": None}
    why = {"raise": "error: retrieval client raised ConnectionError: service unavailable",
           "slow": "deadline_exceeded: retrieval took 30.00 ms, budget 5.00 ms",
           "empty": "empty: no points", "error": "error: down",
           "garbage": "error: ERROR"}  # no status field: an error, named by its status
    cfg = RetrievalSourceConfig(deadline_s=0.005)
    source = (RetrievalSource(clients[kind], vla.actions.vocab_base, cfg, clock=clock)
              if clients[kind] else None)
    ar = ActionDecoder(vla)
    for drafter in (DrafterSource(tiny_drafter, vla), None):
        hybrid = HybridDecoder(vla, HybridConfig(method="heisd", retrieval=cfg),
                               drafter=drafter, retrieval=source, router=router(0.0))
        obs = scenes(1, seed=15)[0]
        got = hybrid.decode(obs, ee_positions_m=STRAIGHT_FAST)
        fallback = "drafter" if drafter is not None else "AR"
        assert got.record.status == (f"retrieval absent: {fallback}" if kind == "absent" else
                                     f"retrieval {why[kind]}; {fallback} mode")
        assert not got.record.verify_skipped
        np.testing.assert_array_equal(got.tokens, ar.decode(obs).tokens)
        want_source = DRAFT_DRAFTER if drafter is not None else DRAFT_NONE
        assert got.record.draft_source == want_source
        if drafter is None:
            assert got.stats.target_forwards == 7


def test_threshold_adapts_within_bounds(tiny_random_vla):
    cfg = HybridConfig(method="ar", skip_threshold=0.95, skip_bounds=(0.93, 0.97),
                       tighten_step=0.01, relax_step=0.005)
    hybrid = HybridDecoder(tiny_random_vla, cfg)
    assert hybrid.episode_end(False) == pytest.approx(0.96)
    assert hybrid.episode_end(False) == pytest.approx(0.97)
    assert hybrid.episode_end(False) == pytest.approx(0.97)
    assert hybrid.episode_end(True) == pytest.approx(0.965)
    for _ in range(20):
        hybrid.episode_end(True)
    assert hybrid.skip_threshold == pytest.approx(0.93)


def test_record_has_every_hybrid_step_msg_field(tiny_random_vla):
    msg = (Path(__file__).resolve().parent.parent / "msg" / "HybridStep.msg").read_text()
    fields = set()
    for line in msg.splitlines():
        m = re.match(r"^\s*([\w/\[\]0-9]+)\s+(\w+)\s*(#.*)?$", line)
        if m and "=" not in line:
            fields.add(m.group(2))
    got = HybridDecoder(tiny_random_vla, HybridConfig(method="ar")).decode(scenes(1, 16)[0])
    missing = fields - set(got.record.to_msg_fields()) - {"header", "step_index", "task"}
    assert not missing


@pytest.mark.parametrize("kwargs, field", [
    ({"method": "eagle"}, "method"), ({"skip_threshold": 0.5}, "skip_threshold"),
    ({"relax_step": 0.1}, "relax_step"),
    ({"relaxed_radius_bins": (9, 9, 9, 9, 9, 9, 3)}, "relaxed_radius_bins")])
def test_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        HybridConfig(**kwargs)


def test_builder_needs_router_stats_and_degrades_without_parts(tiny_random_vla):
    with pytest.raises(ValueError, match="router_stats"):
        build_hybrid_decoder("heisd", tiny_random_vla)
    hybrid = build_hybrid_decoder("retrieval", tiny_random_vla)   # no DB, no head -> AR
    got = hybrid.decode(scenes(1, 17)[0])
    assert got.stats.target_forwards == 7 and "absent" in got.record.status


@pytest.mark.parametrize("cheaper", ["ar", "drafter"])
def test_a_drafter_routed_step_takes_the_cheaper_exact_path(tiny_trained_vla, tiny_drafter,
                                                            cheaper):
    from heisd_ros.decoding.stats import PathCosts

    vla = tiny_trained_vla
    hybrid = HybridDecoder(vla, HybridConfig(method="heisd", retrieval=RS),
                           drafter=DrafterSource(tiny_drafter, vla), retrieval=None,
                           router=router(0.9))
    costs = PathCosts(warm=1, explore_every=1000)
    for path in PathCosts.PATHS:  # as measured earlier on this machine
        costs.record(path, 10.0 if path == cheaper else 50.0)
    hybrid._costs = costs
    ar = ActionDecoder(vla)
    for obs in scenes(3, seed=21):
        got = hybrid.decode(obs, ee_positions_m=STANDING)  # F = 0: the drafter's route
        np.testing.assert_array_equal(got.tokens, ar.decode(obs).tokens)  # exact either way
        assert f"drafter-routed step by {cheaper}" in got.record.why
        if cheaper == "ar":
            assert got.stats.drafter_forwards == 0 and got.stats.target_forwards == 7
            assert got.record.draft_source == DRAFT_NONE
        else:
            assert got.stats.drafter_forwards > 0 and got.record.draft_source == DRAFT_DRAFTER
    assert costs.samples[cheaper] == 1 + 3
    relaxed = HybridDecoder(vla, HybridConfig(method="drafter_relaxed", retrieval=RS),
                            drafter=DrafterSource(tiny_drafter, vla))
    assert relaxed._costs is None  # relaxed drafting gives other tokens than AR: no choice
    off = HybridDecoder(vla, HybridConfig(method="heisd", retrieval=RS,
                                          cost_aware_drafting=False),
                        drafter=DrafterSource(tiny_drafter, vla), router=router(0.9))
    assert off._costs is None


def test_the_rounds_after_a_partial_retrieval_draft_take_the_cheaper_exact_path(
        tiny_trained_vla, tiny_drafter):
    from heisd_ros.decoding.stats import PathCosts

    vla = tiny_trained_vla
    observations = scenes(N_OBS, seed=23)
    got = {}
    for cheaper in ("ar", "drafter"):
        hybrid = HybridDecoder(vla, HybridConfig(method="heisd", retrieval=RS),
                               drafter=DrafterSource(tiny_drafter, vla),
                               retrieval=RetrievalSource(noisy_client(5), vla.actions.vocab_base,
                                                         RS),
                               router=router(0.0))
        costs = PathCosts(warm=1, explore_every=1000)
        for path in PathCosts.PATHS:  # per token, as measured earlier on this machine
            costs.record(path, 2.0 if path == cheaper else 9.0)
        hybrid._tail_costs = costs
        got[cheaper] = [hybrid.decode(obs, ee_positions_m=STRAIGHT_FAST) for obs in observations]
        tails = [r for r in got[cheaper] if r.stats.target_forwards > 1]
        assert tails, "the noisy drafts must leave rounds after the first"
        for r in tails:
            assert r.record.router_mode == ROUTER_RETRIEVAL and not r.record.verify_skipped
            assert f"rounds after the retrieval draft by {cheaper}" in r.record.why
            assert (r.stats.drafter_forwards > 0) == (cheaper == "drafter")
        assert costs.samples[cheaper] == 1 + len(tails)
    for by_ar, by_head in zip(got["ar"], got["drafter"], strict=True):  # exact either way
        np.testing.assert_array_equal(by_ar.tokens, by_head.tokens)
