"""The HeiSD hybrid decoder: kinematic router, retrieval drafts, verify-skip, drafter, AR.

Per control step (one 7-token action):

1. vision: ``target.encode`` (always: the retrieval query needs the pooled vision features);
2. route: methods with a router ask :class:`KinematicRouter` about the last w executed EE
   positions (passed in, or collected from ``observation.proprio[:3]``); high F -> retrieval,
   low F or too short a history -> drafter. ``heisd`` and ``heisd_ar`` draft from retrieval
   on low-F steps too (once the window is full); there the router only keeps steps
   verified. ``heisd_deadline`` also drafts from retrieval before the window is full,
   accepted only where it equals the target's greedy tokens;
3. retrieval: query the DB (deadline-bounded). Slow, empty, failing or absent -> the drafter
   for this step (and AR when there is no draft head);
4. unverified execution (``heisd_ros.decoding.unverified``): ``heisd`` follows the
   demonstration the last executed action came from while the retrieval keeps returning its
   next point and the arm moves as it did; ``router_skip`` and ``heisd`` also execute a best
   candidate whose similarity reaches the current threshold; ``heisd_paper`` executes every
   step the router gives to the DB. Such a step costs ZERO target LLM forwards; it keeps the
   gripper state and the driver's per-command bounds, and at most a configured number run in
   a row (the step after is verified);
5. otherwise decode with :class:`ActionDecoder`: the retrieval group tree rides in the prefill
   forward (a fully accepted draft costs one target forward), later rounds are drafted by the
   draft head or are plain AR forwards (whichever is measured cheaper per token here; the
   same tokens either way); drafter steps use the draft head or plain AR (likewise).

Methods (the paper's ablation ladder, docs/METHOD.md; the table is
``heisd_ros.decoding.methods.METHODS``): ``ar``; ``drafter`` (exact);
``drafter_relaxed`` (Spec-VLA radius); ``retrieval`` (pure retrieval SD, exact: the same
candidates draft every round, no draft head; a failed query -> AR); ``router_only``;
``router_skip`` (+ verify-skip); ``heisd`` (+ sequence-wise group acceptance of retrieval
drafts). ``heisd_ar`` is ``heisd`` with AR in place of the draft head (drafter-routed steps
and the rounds after a partly accepted retrieval draft are plain AR forwards): it tells
whether the draft head pays for itself on the hardware at hand (on a CPU its rounds can cost
more per token than AR's forwards). With relaxation and skip off (``ar``, ``drafter``,
``retrieval``, ``router_only``) the output equals AR greedy token for token.

Gripper safety: every acceptance rule is wrapped so a draft gripper token is only taken when
it equals the target's own token, and an unverified step must keep the executed gripper state
(``observation.episode``; unknown at an episode's first step -> verified).

The skip threshold adapts online (:meth:`HybridDecoder.episode_end`): +``tighten_step`` after
a failed episode, -``relax_step`` after a success, clipped to ``skip_bounds``.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, replace

import numpy as np

from heisd_ros.actions.normalization import ActionCodec
from heisd_ros.data.observation import (
    ACTION_DIM,
    EpisodeState,
    Observation,
)
from heisd_ros.decoding.acceptance import AcceptanceRule, RelaxedRule, VerifyView, exact_rule
from heisd_ros.decoding.behind import BehindChecker, CheckVerdict
from heisd_ros.decoding.deadline import completion_at_deadline
from heisd_ros.decoding.decoder import ActionDecoder
from heisd_ros.decoding.draft_source import AcceptedDraft, DraftContext, DraftSource
from heisd_ros.decoding.drafter_source import DrafterSource, DraftTreeConfig
from heisd_ros.decoding.interface import (
    DRAFT_DRAFTER,
    DRAFT_NONE,
    DRAFT_RETRIEVAL,
    ROUTER_DRAFTER,
    ROUTER_OFF,
    ROUTER_RETRIEVAL,
    ActionResult,
    Decoder,
    HybridStepRecord,
)
from heisd_ros.decoding.methods import METHODS, Switches, check_method
from heisd_ros.decoding.retrieval_accept import GroupAcceptConfig, GroupRule, accepted_group_path
from heisd_ros.decoding.retrieval_source import (
    RetrievalOutcome,
    RetrievalSource,
    RetrievalSourceConfig,
    task_of,
)
from heisd_ros.decoding.stats import STAGES, PathCosts, StageClock, StepStats
from heisd_ros.decoding.unverified import (
    RULE_DEADLINE,
    RULE_FOLLOW,
    RULE_ROUTER,
    RULE_SIMILARITY,
    Anchor,
    Trail,
    UnverifiedConfig,
    follow_problem,
    unverified_problem,
)
from heisd_ros.kinematics.router import (
    MODE_RETRIEVAL,
    KinematicRouter,
    RouteDecision,
    RouterConfig,
)
from heisd_ros.retrieval.embedding import embedding_from_features
from heisd_ros.retrieval.records import Candidate

GRIPPER_DIM = ACTION_DIM - 1
# The HybridStep constants and the record are the interface's, re-exported here.
__all__ = ["DRAFT_DRAFTER", "DRAFT_NONE", "DRAFT_RETRIEVAL", "ROUTER_DRAFTER", "ROUTER_OFF",
           "ROUTER_RETRIEVAL", "HybridConfig", "HybridDecoder", "HybridStepRecord",
           "build_hybrid_decoder", "gripper_safe"]


@dataclass(frozen=True)
class HybridConfig:
    """Hybrid decoder settings (thresholds usually from ``heisd-calibrate``).

    Attributes:
        method: one of ``METHODS``.
        router: router parameters; ``router.threshold`` is the switching threshold on F.
        skip_threshold: initial verify-skip threshold on the top candidate's cosine similarity.
        skip_bounds: (low, high) the online threshold stays within.
        tighten_step: threshold increase after a failed episode.
        relax_step: threshold decrease after a successful one (slow: <= tighten_step).
        group_accept: sequence-wise tolerances (paper: sum <= 30, token <= 15, gripper exact).
        relaxed_radius_bins: Spec-VLA per-dimension radius of ``drafter_relaxed``.
        retrieval: retrieval source settings (K, deadline, demotion, tree).
        drafter_tree: shape of the drafter's dynamic tree.
        unverified: bounds of steps executed without the target, and the ``follow`` rule's
            tolerances (``heisd_ros.decoding.unverified``).
        cost_aware_drafting: decode a drafter-routed step with the draft head or by plain AR,
            and the rounds after a partly accepted retrieval draft with the draft head or by
            plain AR, whichever is measured cheaper on this machine (the same tokens either
            way; ``heisd_ros.decoding.stats.PathCosts``);
            False: always the draft head.
    """

    method: str = "heisd"
    router: RouterConfig = field(default_factory=RouterConfig)
    skip_threshold: float = 0.98
    skip_bounds: tuple[float, float] = (0.9, 0.999)
    tighten_step: float = 0.01
    relax_step: float = 0.002
    group_accept: GroupAcceptConfig = field(default_factory=GroupAcceptConfig)
    relaxed_radius_bins: tuple[int, ...] = (9, 9, 9, 9, 9, 9, 0)
    retrieval: RetrievalSourceConfig = field(default_factory=RetrievalSourceConfig)
    drafter_tree: DraftTreeConfig = field(default_factory=DraftTreeConfig)
    unverified: UnverifiedConfig = field(default_factory=UnverifiedConfig)
    cost_aware_drafting: bool = True

    def __post_init__(self) -> None:
        check_method(self.method)
        lo, hi = (float(x) for x in self.skip_bounds)
        if not -1.0 <= lo <= hi <= 1.0:
            raise ValueError(f"skip_bounds: expected -1 <= low <= high <= 1, got "
                             f"{self.skip_bounds}")
        if not (math.isfinite(self.skip_threshold) and lo <= self.skip_threshold <= hi):
            raise ValueError(f"skip_threshold: expected within skip_bounds {self.skip_bounds}, "
                             f"got {self.skip_threshold}")
        for name in ("tighten_step", "relax_step"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(f"{name}: expected a finite value >= 0, got "
                                 f"{getattr(self, name)}")
        if self.relax_step > self.tighten_step:
            raise ValueError(f"relax_step: expected <= tighten_step={self.tighten_step} "
                             f"(relax slowly), got {self.relax_step}")
        if not self.group_accept.gripper_exact:
            raise ValueError("group_accept.gripper_exact: must be True (never relax the gripper)")
        radius = RelaxedRule(self.relaxed_radius_bins).radius_bins
        if radius[GRIPPER_DIM] != 0:
            raise ValueError(f"relaxed_radius_bins: the gripper radius must be 0, got {radius}")
        object.__setattr__(self, "relaxed_radius_bins", radius)

    def with_skip_threshold(self, threshold: float) -> HybridConfig:
        """This config with ``threshold`` as the skip threshold (bounds widened to hold it)."""
        t = float(threshold)
        lo, hi = self.skip_bounds
        return replace(self, skip_threshold=t, skip_bounds=(min(lo, t), max(hi, t)))

    @property
    def switches(self) -> Switches:
        """Components of ``method``."""
        return METHODS[self.method]


def gripper_safe(rule: AcceptanceRule) -> AcceptanceRule:
    """``rule``, but a path is cut before a gripper token that differs from the target's."""

    def safe(view: VerifyView) -> list[int]:
        path = list(rule(view))
        for n, node in enumerate(path):
            if view.dims[node] == GRIPPER_DIM and view.draft_bins[node] != view.target_bins[node]:
                return path[:n]
        return path

    return safe


class _RetrievalThenDrafter(DraftSource):
    """Retrieval tree in the prefill round, then the drafter (or retrieval) for later rounds.

    ``later_by_ar``: the later rounds are plain target forwards (no tree) instead.
    """

    def __init__(self, retrieval: RetrievalSource, drafter: DraftSource | None,
                 retrieval_rule: AcceptanceRule, drafter_rule: AcceptanceRule,
                 later_by_ar: bool = False):
        self.retrieval, self.drafter = retrieval, drafter
        self.rules = {"retrieval": retrieval_rule, "drafter": drafter_rule}
        self.later_by_ar = later_by_ar
        self.current: DraftSource = retrieval
        self._idle = False   # this round has no draft (an AR forward)

    @property
    def name(self) -> str:
        return "ar" if self._idle else self.current.name

    @property
    def forwards(self) -> int:
        return 0 if self._idle else self.current.forwards

    @property
    def retrieval_calls(self) -> int:
        return 0 if self._idle else self.current.retrieval_calls

    def propose(self, context: DraftContext):
        later = context.hidden is not None
        self._idle = later and self.later_by_ar
        if self._idle:
            return None
        self.current = self.drafter if later and self.drafter is not None else self.retrieval
        return self.current.propose(context)

    def feedback(self, accepted: AcceptedDraft) -> None:
        self.current.feedback(accepted)

    def rule(self, view: VerifyView) -> list[int]:
        return self.rules[self.current.name](view)


class HybridDecoder(Decoder):
    """Decodes one action per call along the path the method and the router choose."""

    def __init__(self, target, config: HybridConfig | None = None, *,
                 drafter: DraftSource | None = None, retrieval: RetrievalSource | None = None,
                 router: KinematicRouter | None = None, codec: ActionCodec | None = None,
                 task: str | None = None):
        """Build from parts (see :func:`build_hybrid_decoder` for paths and names).

        Raises:
            ValueError: a router method without a router (a DB or a draft head may be absent:
                the decoder then degrades per step).
        """
        self.target = target
        self.config = config or HybridConfig()
        sw = self.config.switches
        if sw.router and router is None:
            raise ValueError(f"router: method {self.config.method!r} needs a KinematicRouter")
        self.drafter = drafter if sw.drafter else None
        self.retrieval = retrieval if sw.retrieval else None
        self.router = router if sw.router else None
        self.codec = codec or target.codec
        self.task = task
        self.skip_threshold = float(self.config.skip_threshold)
        self._history: deque = deque(maxlen=self.config.router.window)
        self._trail: Trail | None = None       # the state the last decided step started from
        self._next_trail: Trail | None = None  # the state after it, if the robot got it
        self._drafter_rule = gripper_safe(RelaxedRule(self.config.relaxed_radius_bins)
                                          if sw.drafter_relaxed else exact_rule)
        # Exact drafting and AR give the same tokens: take the one measured cheaper here.
        cost_aware = (self.config.cost_aware_drafting and self.drafter is not None
                      and not sw.drafter_relaxed)
        self._costs = PathCosts() if cost_aware else None
        # The rounds after a partly accepted retrieval draft, both exact: drafted by the
        # draft head or plain AR forwards, by measured ms per token they produce.
        self._tail_costs = PathCosts() if cost_aware and self.retrieval is not None else None
        self._retrieval_rule = gripper_safe(GroupRule(self.config.group_accept)
                                            if sw.sequence_wise else exact_rule)
        # heisd_behind: the target checks each unverified action while it executes.
        self._checker = (BehindChecker(target, self._retrieval_rule) if sw.checks_behind
                         else None)
        #: Prices a decode path's work for the path choices above: (``StepStats``, whether
        #: the prefill counts) -> ms. None: the measured stage times. Real-time evaluation at
        #: a latency profile sets the profile's prices (``heisd_ros.latency.pricing.work_ms``),
        #: so the choices, and the run, do not depend on this machine's load.
        self.path_pricing = None

    # ------------------------------------------------------------------ episodes
    def begin_episode(self, task: str | None = None) -> None:
        """Reset per-episode state (EE history, unverified run, demotions); set the DB task.

        A check still pending from the last episode is collected first (see
        :meth:`collect_check` to get its verdict).
        """
        self.collect_check()
        self._history.clear()
        self._trail = self._next_trail = None
        self.task = task if task is not None else self.task
        if self.retrieval is not None:
            self.retrieval.reset_episode()

    def collect_check(self) -> CheckVerdict | None:
        """The verdict on the last unverified action if its check is pending (waits for it).

        ``heisd_behind``'s last step of an episode has no next step to collect it: the loop
        that ends the episode calls this. None when nothing is pending.
        """
        if self._checker is None:
            return None
        return self._checker.collect()[0]

    @property
    def checks_started(self) -> int:
        """Checks behind started so far (``heisd_behind``)."""
        return self._checker.started if self._checker is not None else 0

    def episode_end(self, success: bool) -> float:
        """Adapt the skip threshold to the episode's outcome; returns the new threshold."""
        lo, hi = self.config.skip_bounds
        step = -self.config.relax_step if success else self.config.tighten_step
        self.skip_threshold = float(min(hi, max(lo, self.skip_threshold + step)))
        return self.skip_threshold

    # ------------------------------------------------------------------ one step
    def decode(self, observation: Observation,
               ee_positions_m: np.ndarray | None = None) -> ActionResult:
        """Decode one action; never raises for a retrieval problem (it degrades instead).

        Args:
            observation: the current observation. Its ``episode`` (kept by the loop that
                sends the commands) starts a new episode at step 0 and says which gripper
                state the robot has (None: unknown, so nothing is verify-skipped);
                ``proprio[:3]`` (m) feeds the router's history unless ``ee_positions_m`` is
                given.
            ee_positions_m: (n, 3) last executed EE positions, oldest first (optional).
        """
        sw, clock = self.config.switches, StageClock(self.target.device)
        episode = observation.episode
        if episode is not None and episode.starting:
            self.begin_episode(episode.task)
        if observation.proprio is not None and len(observation.proprio) >= 3:
            self._history.append(np.asarray(observation.proprio[:3], dtype=np.float64))
        record, notes = HybridStepRecord(skip_threshold=self.skip_threshold), []
        with clock.stage("vision"):
            prefix = self.target.encode(observation)

        # use_retrieval: query the DB and draft from it; may_skip: a step may run unverified.
        use_retrieval = may_skip = sw.retrieval
        exact_draft = False     # the retrieval draft accepted only where it is the target's
        if self.router is not None:
            history = (np.asarray(ee_positions_m, dtype=np.float64).reshape(-1, 3)
                       if ee_positions_m is not None else np.asarray(list(self._history)))
            decision = self.router.decide(history.reshape(-1, 3))
            _fill_route(record, decision)
            window_full = math.isfinite(decision.fused)   # NaN: too short a window
            may_skip = decision.mode == MODE_RETRIEVAL
            if sw.checks_behind and not self.config.unverified.behind_router_gate:
                # Checked behind: any step with the router's full window may run unverified.
                may_skip = window_full
            exact_draft = sw.drafts_from_retrieval_from_start and not window_full
            slow_retrieval = not may_skip and sw.drafts_from_retrieval_when_slow and window_full
            use_retrieval = may_skip or slow_retrieval or exact_draft
            notes.append(f"router F={decision.fused:.3f} vs {decision.threshold:.3f} "
                         f"({decision.n_points} pts) -> {decision.mode}"
                         + (" (retrieval drafts, verified)" if slow_retrieval else "")
                         + (" (retrieval drafts, verified exactly)" if exact_draft else ""))
        outcome = None
        if use_retrieval and self.retrieval is None:
            use_retrieval = False
            record.status = "retrieval absent: " + self._fallback_name()
        elif use_retrieval:
            with clock.stage("retrieval"):
                embedding = embedding_from_features(prefix.vision_features)
                outcome = self.retrieval.query(self.task or task_of(observation), embedding)
            record.retrieval_calls = 1
            record.skip_similarity = outcome.top_score
            if not outcome.ok:
                use_retrieval = False
                record.status = (f"retrieval {outcome.status.name.lower()}: {outcome.reason}; "
                                 f"{self._fallback_name()} mode")

        trail = self._trail_for(episode)
        chosen = (self._unverified_choice(outcome, episode, trail, notes)
                  if use_retrieval and may_skip else None)
        verdict = None
        collected = False
        if chosen is not None and self._checker is not None and self._checker.pending:
            # Another unverified action only once the last one is confirmed.
            verdict = self._collect_verdict(record, notes)
            collected = True
            if not verdict.confirmed:
                chosen = None
                notes.append("verified: the check behind rejected the last action")
        if chosen is not None:
            candidate, rule = chosen
            result = self._skipped(candidate, prefix)
            record.skip_rule, record.unverified_run = rule, trail.run + 1
            anchor = Anchor.of(candidate)
            if self._checker is not None:
                self._checker.start(prefix, episode.gripper_closed if episode else None,
                                    candidate.bins, episode.step_index if episode else -1, rule)
                record.checked_behind = True
                # Its forward: the prompt's uncached positions, then the 7 executed tokens.
                result.stats.check_tokens = (
                    int(prefix.embeds.shape[1]) - int(prefix.static_length or 0), ACTION_DIM)
        else:
            complete = None
            if sw.completes_at_deadline and use_retrieval and self._checker is not None:
                if self._checker.pending:   # a completion starts a check: this one first
                    verdict = self._collect_verdict(record, notes)
                    collected = True
                if verdict is None or verdict.confirmed:
                    complete = completion_at_deadline(
                        self.target.actions, self.codec, self._checker, self.config.unverified,
                        episode, trail, notes)
                else:
                    notes.append("no completion at the deadline: the check behind rejected "
                                 "the last action")
            result = self._verified(observation, prefix, outcome if use_retrieval else None,
                                    notes, complete, exact=exact_draft)
            # Only the follow rule reads the anchor: others skip the candidates' comparison.
            anchor = (_executed_point(outcome, result.bins, self.retrieval.config.judge)
                      if sw.follow and use_retrieval else None)
            if result.stats.completed_tokens:
                record.skip_rule, record.unverified_run = RULE_DEADLINE, trail.run + 1
                record.checked_behind = True   # the stats carry the check (ActionDecoder)
            elif self._checker is not None and self._checker.pending:
                # A verified step needs no verdict first: its forwards overlap the check.
                verdict = self._collect_verdict(record, notes)
        if episode is not None:
            ee_m = self._history[-1] if self._history else None
            self._trail = trail  # what this step started from, should it be decided again
            self._next_trail = Trail(episode.step_index + 1, record.unverified_run, anchor, ee_m)
        stats = result.stats
        stats.vision_calls, stats.collected_verdict = 1, collected
        if record.status.endswith("drafter mode") and not stats.draft_source:
            # Drafter mode decodes by AR where that is measured cheaper (PathCosts): say so.
            record.status += " (decoded by AR, measured cheaper here)"
        stats.retrieval_calls += record.retrieval_calls
        ms = dict(stats.stage_ms)
        ms.update(clock.finish())
        for stage in ("prefill", "draft", "verify"):
            ms[stage] = stats.stage_ms.get(stage, 0.0)
        ms["overhead"] = max(0.0, ms["total"] - sum(ms[s] for s in STAGES[:5]))
        stats.stage_ms = ms
        _fill_result(record, result, use_retrieval, ms)
        record.why = "; ".join(notes + ([record.status] if record.status else []))
        return replace(result, record=record, behind=verdict)

    # ------------------------------------------------------------------ paths
    def _path_ms(self, stats: StepStats, prefill: bool) -> float:
        """A decode path's cost for the path choices: priced, or its measured stages."""
        if self.path_pricing is not None:
            return float(self.path_pricing(stats, prefill))
        stages = ("prefill", "draft", "verify") if prefill else ("draft", "verify")
        return sum(stats.stage_ms.get(s, 0.0) for s in stages)

    def _fallback_name(self) -> str:
        return "drafter" if self.drafter is not None else "AR"

    def _collect_verdict(self, record: HybridStepRecord, notes: list[str]) -> CheckVerdict:
        """Collect the pending check into ``record`` (its result, bin difference, wait)."""
        verdict, wait_ms = self._checker.collect()
        record.behind_result = verdict.result
        record.behind_bin_difference = verdict.bin_difference
        record.behind_wait_ms, record.behind_check_ms = wait_ms, verdict.check_ms
        notes.append(f"check behind of step {verdict.step_index} ({verdict.rule}): "
                     f"{'confirmed' if verdict.confirmed else 'rejected'}, "
                     f"{verdict.bin_difference} bins off, waited {wait_ms:.1f} ms")
        return verdict

    def _trail_for(self, episode: EpisodeState | None) -> Trail:
        """What was executed before this step: the run of unverified steps and the anchor.

        The previous decision counts only when the robot got it (the loop advanced its
        episode by one step); a decision that was held (same step again) is forgotten.
        """
        if episode is None:
            return Trail(-1)
        for trail in (self._next_trail, self._trail):
            if trail is not None and trail.step_index == episode.step_index:
                return trail
        return Trail(episode.step_index)

    def _unverified_choice(self, outcome: RetrievalOutcome, episode: EpisodeState | None,
                           trail: Trail, notes: list[str]) -> tuple[Candidate, str] | None:
        """(candidate, rule) to execute without the target, or None: verify this step."""
        sw, cfg = self.config.switches, self.config.unverified
        choices: list[tuple[Candidate, str, int]] = []
        if sw.follow:
            successor = (trail.anchor.next_point(outcome.candidates, cfg.follow_window)
                         if trail.anchor is not None else None)
            ahead = successor.record.lookahead_bins if successor is not None else ()
            next_gripper = (float(self.codec.decode(np.asarray(ahead[0], np.int64))[GRIPPER_DIM])
                            if len(ahead) else None)
            moved = (self._history[-1] - trail.ee_position_m
                     if trail.ee_position_m is not None and self._history else None)
            problem = follow_problem(trail.anchor, successor, next_gripper, moved, episode, cfg)
            if problem:
                notes.append(f"follow: {problem}")
            else:
                choices.append((successor, RULE_FOLLOW, cfg.max_run))
        if sw.router_executes:
            choices.append((outcome.candidates[0], RULE_ROUTER, cfg.paper_max_run))
        if sw.verify_skip:
            top = outcome.candidates[0]
            # Written so that NaN (which RetrievalSource refuses anyway) verifies.
            if top.score >= self.skip_threshold:
                choices.append((top, RULE_SIMILARITY, cfg.max_run))
            else:
                notes.append(f"verify: similarity {top.score:.4f} < {self.skip_threshold:.4f}")
        for candidate, rule, max_run in choices:
            if sw.checks_behind:
                max_run = cfg.behind_max_run
            action = self.codec.decode(np.asarray(candidate.bins, np.int64))
            problem = unverified_problem(action, episode, trail.run, max_run, cfg)
            if problem:
                notes.append(f"verify ({rule}): {problem}")
                continue
            record = candidate.record
            notes.append(f"unverified ({rule}, run {trail.run + 1}): {record.task} episode "
                         f"{record.episode} step {record.step}, similarity "
                         f"{candidate.score:.4f}")
            return candidate, rule
        return None

    def _skipped(self, candidate: Candidate, prefix) -> ActionResult:
        bins = np.asarray(candidate.bins, dtype=np.int64)
        stats = StepStats(tokens_from_draft=ACTION_DIM, draft_source="retrieval")
        return ActionResult(tokens=np.asarray(self.target.actions.token_of_bin(bins), np.int64),
                            bins=bins, action=self.codec.decode(bins), hidden=None,
                            vision_features=prefix.vision_features, stats=stats,
                            record=HybridStepRecord(verify_skipped=True))

    def _verified(self, observation: Observation, prefix, outcome: RetrievalOutcome | None,
                  notes: list[str], complete=None, exact: bool = False) -> ActionResult:
        """Decode with the target.

        ``exact``: the retrieval draft is accepted only where it equals the target's greedy
        tokens, not by the method's relaxed rule (``complete`` still applies).

        ``complete`` (with a retrieval draft): ``heisd_deadline``'s completion at
        ``deadline_forwards`` (:func:`~heisd_ros.decoding.deadline.completion_at_deadline`).
        """
        tail = None
        if outcome is not None:
            self.retrieval.prepare(outcome)
            tail = self._tail_costs.choose() if self._tail_costs is not None else None
            source = _RetrievalThenDrafter(self.retrieval, self.drafter,
                                           exact_rule if exact else self._retrieval_rule,
                                           self._drafter_rule,
                                           later_by_ar=tail == "ar")
            budget = self.config.unverified.deadline_forwards if complete is not None else None
            decoder = ActionDecoder(self.target, source, source.rule, self.codec,
                                    draft_in_prefill=True, forward_budget=budget,
                                    complete=complete)
        elif self.drafter is not None and (self._costs is None
                                           or self._costs.choose() == "drafter"):
            decoder = ActionDecoder(self.target, self.drafter, self._drafter_rule, self.codec)
        else:
            decoder = ActionDecoder(self.target, codec=self.codec)
        r = decoder.decode(observation, prefix)
        if outcome is None and self._costs is not None:
            path = "drafter" if decoder.source is not None else "ar"
            self._costs.record(path, self._path_ms(r.stats, prefill=True))
            notes.append(f"drafter-routed step by {path} ({self._costs.describe()})")
        elif tail is not None and r.stats.target_forwards > 1:   # the tail ran
            first = r.stats.accepted_lengths[0] if r.stats.accepted_lengths else 1
            self._tail_costs.record(tail, self._path_ms(r.stats, prefill=False)
                                    / (ACTION_DIM - first))
            notes.append(f"rounds after the retrieval draft by {tail} "
                         f"({self._tail_costs.describe()} per token)")
        return replace(r, record=HybridStepRecord())


def _executed_point(outcome: RetrievalOutcome, bins: np.ndarray,
                    judge: GroupAcceptConfig) -> Anchor | None:
    """The retrieved point whose action the verified step executed, if any.

    Exactly that action first; else the first candidate the sequence-wise rule ``judge``
    would have accepted whole against the executed action.
    """
    if not outcome.ok:
        return None
    executed = np.asarray(bins, dtype=np.int64)
    drafts = [np.asarray(c.bins, dtype=np.int64) for c in outcome.candidates]
    for candidate, draft in zip(outcome.candidates, drafts, strict=True):
        if np.array_equal(draft, executed):
            return Anchor.of(candidate)
    chain, dims = np.arange(ACTION_DIM) - 1, np.arange(ACTION_DIM)
    for candidate, draft in zip(outcome.candidates, drafts, strict=True):
        if len(accepted_group_path(chain, draft, executed, dims, judge)) == ACTION_DIM:
            return Anchor.of(candidate)
    return None


def _fill_route(record: HybridStepRecord, d: RouteDecision) -> None:
    record.router_mode = ROUTER_RETRIEVAL if d.mode == MODE_RETRIEVAL else ROUTER_DRAFTER
    record.fused_metric, record.curvature_term = d.fused, d.norm_radius
    record.displacement_term, record.curvature_radius_m = d.norm_displacement, d.radius_m
    record.displacement_m, record.router_threshold = d.displacement_m, d.threshold


def _fill_result(record: HybridStepRecord, result: ActionResult, used_retrieval: bool,
                 stage_ms: dict) -> None:
    stats = result.stats
    record.verify_skipped = result.record.verify_skipped
    record.draft_source = (DRAFT_RETRIEVAL if used_retrieval
                           else DRAFT_DRAFTER if stats.draft_source else DRAFT_NONE)
    record.accepted_tokens = stats.tokens_from_draft
    record.accepted_length_per_round = list(stats.accepted_lengths)
    record.first_error_position = stats.first_error_position
    record.target_forwards = stats.target_forwards
    record.drafter_forwards = stats.drafter_forwards
    record.retrieval_calls = stats.retrieval_calls
    record.action_bins = [int(b) for b in result.bins]
    record.action = [float(a) for a in result.action]
    record.stage_ms = stage_ms


def build_hybrid_decoder(method: str, target, *, draft_head=None, retriever=None,
                         store=None, router_stats=None, calibration=None,
                         config: HybridConfig | None = None, codec: ActionCodec | None = None,
                         task: str | None = None,
                         skip_threshold: float | None = None,
                         router_threshold: float | None = None) -> HybridDecoder:
    """A :class:`HybridDecoder` for ``method`` from paths or objects.

    Args:
        method: one of ``METHODS``.
        target: the target VLA.
        draft_head: a DraftHead, a safetensors path (``heisd-train-drafter``), or None (the
            decoder then uses AR where it would draft).
        retriever: a retrieval client (``Retriever`` or a ROS service client), or None.
        store: an opened ``VectorStore`` to query in-process instead (one store shared by
            several decoders of a process: an embedded DB can be opened once;
            ``heisd_ros.decoder_loader.open_warm_store`` opens one checked and warmed up).
        router_stats: RouterStats or a JSON path (``heisd-build-db`` writes one per suite).
        calibration: a loaded, checked ``VerifySkipCalibration`` (``heisd_ros.decoder_loader``
            reads it), or None; its ``apply(config)`` sets the skip and router thresholds.
        config: further settings (its method is replaced by ``method``).
        codec: the action codec (default: the target's, ``target.codec``).
        task: DB collection to query (default: per observation, ``task_of``).
        skip_threshold: the verify-skip similarity threshold, over the calibration's (e.g.
            one tuned on closed-loop validation episodes); None: the calibration's.
        router_threshold: the router's threshold on F, over the calibration's; None: the
            calibration's.
    """
    from heisd_ros.kinematics.router import RouterStats

    config = replace(config or HybridConfig(), method=method)
    if calibration is not None:
        config = calibration.apply(config)
    if skip_threshold is not None:
        config = config.with_skip_threshold(skip_threshold)
    if router_threshold is not None:
        config = replace(config, router=replace(config.router, threshold=float(router_threshold)))
    sw = config.switches
    drafter = None
    if sw.drafter and draft_head is not None:
        if isinstance(draft_head, str | bytes) or hasattr(draft_head, "__fspath__"):
            from heisd_ros.models.checkpoint import load_draft_head

            draft_head = load_draft_head(draft_head, target)
        drafter = DrafterSource(draft_head, target, config.drafter_tree)
    retrieval = None
    if sw.retrieval and retriever is None and store is not None:
        from heisd_ros.retrieval.retriever import Retriever, RetrieverConfig

        retriever = Retriever(store, RetrieverConfig(k=config.retrieval.k, demote_steps=0))
    if sw.retrieval and retriever is not None:
        retrieval = RetrievalSource(retriever, target.actions.vocab_base, config.retrieval)
    router = None
    if sw.router:
        stats = router_stats if router_stats is None or isinstance(router_stats, RouterStats) \
            else RouterStats.load(router_stats)
        if stats is None:
            raise ValueError(f"router_stats: method {method!r} needs router statistics "
                             f"(heisd-build-db writes router_stats_<suite>.json)")
        if stats.window != config.router.window:  # a partial window stays within the window
            config = replace(config, router=replace(
                config.router, window=stats.window,
                min_points=min(config.router.min_points, stats.window)))
        router = KinematicRouter(config.router, stats)
    return HybridDecoder(target, config, drafter=drafter, retrieval=retrieval, router=router,
                         codec=codec, task=task)
