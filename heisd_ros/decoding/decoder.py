"""Decode one 7-token action: AR greedy, or speculative with any draft source.

``ActionDecoder(target)`` is the AR baseline (1 prefill + 6 decode forwards).
``ActionDecoder(target, source, rule)`` asks ``source`` for a tree before every forward after
the prefill (or also for the prefill itself with ``draft_in_prefill=True``, which retrieval
uses so a fully accepted draft costs one target forward). With ``forward_budget`` and
``complete``, an action still incomplete after that many target forwards is handed to
``complete`` (``heisd_deadline``: it fills in the rest from the target's predictions along
the draft and has the rest verified behind). Results are
:class:`~heisd_ros.decoding.interface.ActionResult` without a path record.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from heisd_ros.actions.normalization import ActionCodec
from heisd_ros.data.observation import ACTION_DIM, Observation
from heisd_ros.decoding.acceptance import AcceptanceRule, exact_rule
from heisd_ros.decoding.draft_source import AcceptedDraft, DraftContext, DraftSource
from heisd_ros.decoding.interface import ActionResult, Decoder
from heisd_ros.decoding.stats import StageClock, StepStats
from heisd_ros.decoding.step import speculative_step
from heisd_ros.models.target import Prefix, TargetVLA

_ACTION_IDS = itertools.count(1)

__all__ = ["ActionDecoder", "ActionResult", "gripper_state"]


def gripper_state(observation: Observation) -> bool | None:
    """The gripper's current state, None when unknown.

    From ``observation.episode``: the state after the last command the robot got, kept by the
    loop that sends the commands (``DecoderPolicy``, the policy node).
    """
    return observation.episode.gripper_closed if observation.episode is not None else None


class ActionDecoder(Decoder):
    """Greedy or speculative decoding of one action per call (see the module docstring)."""

    def __init__(self, target: TargetVLA, source: DraftSource | None = None,
                 rule: AcceptanceRule = exact_rule, codec: ActionCodec | None = None,
                 draft_in_prefill: bool = False, forward_budget: int | None = None,
                 complete=None):
        """A decoder of one action per call; ``complete`` stops it early.

        ``complete(state, last_round)``: with ``forward_budget``, called once the action is
        still incomplete after that many target forwards (``last_round``: the last
        ``RoundResult``); returns the remaining action token ids, having started the check
        of them behind from ``state`` (they end the action unverified; ``state``, holding the
        verified ones, is the caller's from then on), or None (decoding goes on). The stats
        then carry that check as the forward the action left out (``check_tokens``,
        ``check_from_cache``).
        """
        if draft_in_prefill and source is None:
            raise ValueError("draft_in_prefill: needs a draft source")
        if (forward_budget is None) != (complete is None):
            raise ValueError("forward_budget and complete: give both or neither")
        self.target = target
        self.source = source
        self.rule = rule
        self.codec = codec or target.codec
        self.draft_in_prefill = draft_in_prefill
        self.forward_budget, self.complete = forward_budget, complete

    def decode(self, observation: Observation, prefix: Prefix | None = None) -> ActionResult:
        """Decode the 7 action tokens of ``observation`` and return them with counters.

        ``prefix``: ``target.encode(observation)`` when the caller already ran it (a hybrid
        needs the vision features before deciding how to decode); vision is then not timed.
        """
        target, stats = self.target, StepStats()
        clock = StageClock(target.device)
        if prefix is None:
            with clock.stage("vision"):
                prefix = target.encode(observation)
            stats.vision_calls = 1
        state = target.start(prefix, gripper_state(observation))
        action_id = next(_ACTION_IDS)
        # All (hidden state, next input embedding) pairs of this action, for draft sources.
        hidden, seen_hidden, seen_next = [], None, None
        sources = []
        tail: list[int] = []
        while len(state.action_tokens) < ACTION_DIM:
            first_round = state.cached_length < state.prefix_length   # prompt not all run yet
            tree = None
            if self.source is not None and (self.draft_in_prefill or not first_round):
                context = DraftContext(
                    observation=observation, vision_features=prefix.vision_features,
                    action_tokens=tuple(state.action_tokens),
                    max_depth=ACTION_DIM - len(state.action_tokens),
                    committed_length=state.committed_length, hidden=seen_hidden,
                    next_embeds=seen_next, first_call=not sources, action_id=action_id)
                with clock.stage("draft"):
                    tree = self.source.propose(context)
                stats.drafter_forwards += self.source.forwards
                stats.retrieval_calls += self.source.retrieval_calls
                stats.draft_calls += 1
                sources.append(self.source.name)
            stats.forward_tokens.append((int(state.pending_embeds.shape[1]),
                                         len(tree) if tree is not None else 0))
            with clock.stage("prefill" if first_round else "verify"):
                result = speculative_step(target, state, tree, self.rule, ACTION_DIM)
            stats.target_forwards += 1
            if len(result.tree):
                stats.accepted_lengths.append(len(result.tokens))
                stats.tokens_from_draft += len(result.path)
                if stats.first_error_position < 0:
                    stats.first_error_position = result.first_rejected_dim
                self.source.feedback(AcceptedDraft(result.tree, tuple(result.path),
                                                   result.target_bins, result.bonus_token))
            hidden.append(result.predicting_hidden)
            if seen_hidden is None:
                seen_hidden, seen_next = result.new_hidden, result.next_embeds
            else:
                seen_hidden = torch.cat([seen_hidden, result.new_hidden], dim=1)
                seen_next = torch.cat([seen_next, result.next_embeds], dim=1)
            if (self.complete is not None and len(state.action_tokens) < ACTION_DIM
                    and stats.target_forwards >= self.forward_budget):
                pending = int(state.pending_embeds.shape[1])
                tail = [int(t) for t in self.complete(state, result) or ()]
                if tail:
                    stats.check_tokens, stats.check_from_cache = (pending, len(tail)), True
                    break
        stats.draft_source = "+".join(sorted(set(sources)))
        stats.stage_ms = clock.finish()
        stats.completed_tokens = len(tail)
        tokens = np.asarray(list(state.action_tokens) + tail, dtype=np.int64)
        if len(tokens) != ACTION_DIM:
            raise ValueError(f"complete: returned {len(tail)} tokens, the action needed "
                             f"{ACTION_DIM - len(state.action_tokens)}")
        bins = target.actions.bin_of_token(tokens)
        return ActionResult(tokens=tokens, bins=bins, action=self.codec.decode(bins),
                            hidden=None if tail else torch.cat(hidden),
                            vision_features=prefix.vision_features, stats=stats)
