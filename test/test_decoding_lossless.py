"""Lossless decoding: AR greedy == transformers' generate; drafter-exact == AR.

Token for token, with random and with trained weights; counters add up; relaxed acceptance
stays in bounds and never moves the gripper; a draft can ride along in the prefill.
"""

import numpy as np
import pytest

from heisd_ros.decoding.acceptance import RelaxedRule, exact_rule
from heisd_ros.decoding.decoder import ActionDecoder
from heisd_ros.decoding.draft_source import DraftSource
from heisd_ros.decoding.drafter_source import DrafterSource, DraftTreeConfig
from heisd_ros.decoding.hf_reference import hf_generate_action
from heisd_ros.models.draft_head import DraftHead, DraftHeadConfig
from heisd_ros.models.draft_tree import DraftTree
from test.fixtures_decoding import scenes

N_OBS = 12


def test_ar_equals_transformers_generate(tiny_vla):
    ar = ActionDecoder(tiny_vla)
    for obs in scenes(N_OBS, seed=1):
        result = ar.decode(obs)
        np.testing.assert_array_equal(result.tokens, hf_generate_action(tiny_vla, obs))
        assert result.stats.target_forwards == 7
        assert result.stats.accepted_lengths == [] and result.stats.tokens_from_draft == 0
        assert result.hidden.shape == (7, tiny_vla.hidden_size)


def test_trained_model_is_input_dependent(tiny_trained_vla):
    # Guards the "trained weights" case against a degenerate constant policy.
    ar = ActionDecoder(tiny_trained_vla)
    actions = {tuple(ar.decode(obs).bins) for obs in scenes(N_OBS, seed=1)}
    assert len(actions) > N_OBS // 2


@pytest.mark.parametrize("tree", [DraftTreeConfig(), DraftTreeConfig(top_k=2, node_budget=6),
                                  DraftTreeConfig(top_k=8, max_depth=3, node_budget=40)])
def test_drafter_exact_equals_ar(tiny_vla, tiny_drafter, tree):
    ar = ActionDecoder(tiny_vla)
    sd = ActionDecoder(tiny_vla, DrafterSource(tiny_drafter, tiny_vla, tree), exact_rule)
    for obs in scenes(N_OBS, seed=2):
        want, got = ar.decode(obs), sd.decode(obs)
        np.testing.assert_array_equal(got.tokens, want.tokens)
        s = got.stats
        assert s.target_forwards == 1 + len(s.accepted_lengths)   # prefill + verify rounds
        assert 1 + sum(s.accepted_lengths) == 7
        # Every round adds a bonus token except possibly the last (when its path completed).
        rounds = len(s.accepted_lengths)
        produced = sum(s.accepted_lengths)
        assert produced - rounds <= s.tokens_from_draft <= produced - rounds + 1
        assert s.drafter_forwards >= len(s.accepted_lengths)
        assert s.draft_source == "drafter"
        np.testing.assert_allclose(got.hidden.numpy(), want.hidden.numpy(), atol=1e-4)


def test_trained_drafter_accepts_more_than_an_untrained_one(tiny_trained_vla, tiny_drafter):
    untrained = DraftHead(DraftHeadConfig.for_target(tiny_trained_vla)).eval()
    def forwards(head):
        sd = ActionDecoder(tiny_trained_vla, DrafterSource(head, tiny_trained_vla))
        return np.mean([sd.decode(o).stats.target_forwards for o in scenes(N_OBS, seed=3)])
    assert forwards(tiny_drafter) < forwards(untrained)
    assert forwards(tiny_drafter) < 7


def test_relaxed_radius_zero_is_lossless(tiny_trained_vla, tiny_drafter):
    ar = ActionDecoder(tiny_trained_vla)
    sd = ActionDecoder(tiny_trained_vla, DrafterSource(tiny_drafter, tiny_trained_vla),
                       RelaxedRule((0,) * 7))
    for obs in scenes(6, seed=4):
        np.testing.assert_array_equal(sd.decode(obs).tokens, ar.decode(obs).tokens)


class RecordingRule:
    """Wraps a rule and keeps every (view, accepted path) it produced (observation only)."""

    def __init__(self, rule):
        self.rule, self.calls = rule, []

    def __call__(self, view):
        path = self.rule(view)
        self.calls.append((view, path))
        return path


def test_relaxed_decoding_stays_in_bounds_and_keeps_the_gripper(tiny_trained_vla, tiny_drafter):
    rule = RecordingRule(RelaxedRule((12, 12, 12, 12, 12, 12, 0)))
    sd = ActionDecoder(tiny_trained_vla, DrafterSource(tiny_drafter, tiny_trained_vla), rule)
    for obs in scenes(8, seed=5):
        sd.decode(obs)
    assert rule.calls
    for view, path in rule.calls:
        for node in path:
            deviation = abs(int(view.draft_bins[node]) - int(view.target_bins[node]))
            assert deviation <= (0 if view.dims[node] == 6 else 12)


class FixedChainSource(DraftSource):
    """Proposes a fixed 7-token action as a chain (what a retrieval source does)."""

    name = "fixed"

    def __init__(self, tokens):
        self.tokens = list(tokens)

    def propose(self, context):
        done = len(context.action_tokens)
        return DraftTree.chain(self.tokens[done:done + context.max_depth], source=self.name)

    @property
    def retrieval_calls(self):
        return 1


def test_draft_in_prefill_accepts_a_whole_action_in_one_forward(tiny_trained_vla):
    vla = tiny_trained_vla
    for obs in scenes(4, seed=6):
        want = ActionDecoder(vla).decode(obs).tokens
        right = ActionDecoder(vla, FixedChainSource(want), draft_in_prefill=True).decode(obs)
        np.testing.assert_array_equal(right.tokens, want)
        assert right.stats.target_forwards == 1 and right.stats.accepted_lengths == [7]
        assert right.stats.tokens_from_draft == 7 and right.stats.first_error_position == -1
        assert right.stats.retrieval_calls == 1
        wrong = [t if i != 3 else vla.actions.token_of_bin((vla.actions.bin_of_token(t) + 1) % 256)
                 for i, t in enumerate(want)]
        result = ActionDecoder(vla, FixedChainSource(wrong), draft_in_prefill=True).decode(obs)
        np.testing.assert_array_equal(result.tokens, want)
        assert result.stats.first_error_position == 3
        assert result.stats.accepted_lengths[0] == 4      # dims 0..2 accepted + bonus at 3


class EveryOtherRound(DraftSource):
    """A hybrid-like source: the drafter drafts only on every other round."""

    name = "alternating"

    def __init__(self, drafter):
        self.drafter, self.calls = drafter, 0

    def propose(self, context):
        self.calls = 0 if context.first_call else self.calls + 1
        return self.drafter.propose(context) if self.calls % 2 else None


def test_drafter_can_skip_rounds(tiny_trained_vla, tiny_drafter):
    vla = tiny_trained_vla
    source = EveryOtherRound(DrafterSource(tiny_drafter, vla))
    ar, hybrid = ActionDecoder(vla), ActionDecoder(vla, source)
    drafted = 0
    for obs in scenes(6, seed=7):
        result = hybrid.decode(obs)
        np.testing.assert_array_equal(result.tokens, ar.decode(obs).tokens)
        s = result.stats
        # After the prefill the rounds go AR, draft, AR, draft...: every other one verifies a
        # draft, and the AR rounds give one token each.
        rounds = s.target_forwards - 1
        assert len(s.accepted_lengths) == rounds // 2, (rounds, s.accepted_lengths)
        assert 1 + (rounds - rounds // 2) + sum(s.accepted_lengths) == 7
        drafted += s.tokens_from_draft
    assert drafted > 0
