"""Decoding methods by name for the tools: the context they load, and the per-step record.

The method table is :data:`heisd_ros.decoding.methods.METHODS` and the decoders come from
:func:`heisd_ros.decoding.builder.build_decoder`; here the tools (heisd-eval, heisd-replay,
heisd-record) load their resources into a :class:`MethodContext` (:func:`make_context`) and
:func:`build_method` hands them to the builder.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from heisd_ros.data.observation import EpisodeState
from heisd_ros.decoding.builder import DEFAULT_RELAXED_RADIUS_BINS, DecoderResources
from heisd_ros.decoding.methods import HYBRID_METHODS, METHODS, needs_head
from heisd_ros.latency.counters import DecisionCounters

__all__ = ["DecoderPolicy", "MethodContext", "build_method", "check_methods", "context_from_args",
           "make_context", "router_stats_for"]


@dataclass
class MethodContext:
    """The tools' decoder resources, plus the embedded DB they open once per process.

    Attributes:
        resources: what every method's decoder is built from (target, draft head, router
            statistics, calibration, tree settings); the tools set ``router_stats`` per suite.
        db: a ``StoreConfig`` of a DB to open in-process, a retrieval client (``Retriever``),
            or None (hybrid methods then degrade to the drafter / AR per step).
        tasks: the DB collections this process will query (empty = all); an in-process
            store loads only these, so worker processes sharing one DB never lock each
            other's shards.
        opened_store: the in-process store opened from ``db`` by the first hybrid method
            (None until then; :meth:`close` releases it).
    """

    resources: DecoderResources
    db: Any = None
    tasks: tuple[str, ...] = ()
    opened_store: Any = None

    def close(self) -> None:
        """Release the in-process store, if one was opened (its shard locks go with it)."""
        if self.opened_store is not None:
            self.opened_store.close()
            self.opened_store = None


def check_methods(names) -> list[str]:
    """``names`` as a list, with "ar" first (the reference); ValueError listing valid names."""
    names = list(dict.fromkeys(names))
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise ValueError(f"methods: unknown {unknown}; valid names are {sorted(METHODS)}")
    return ["ar"] + [n for n in names if n != "ar"]


def build_method(name: str, ctx: MethodContext):
    """The decoder of method ``name`` (ValueError listing the valid names if unknown)."""
    from heisd_ros.decoding.builder import build_decoder

    check_methods([name])
    store = None
    if METHODS[name].hybrid and type(ctx.db).__name__ == "StoreConfig":
        if ctx.opened_store is None:
            from heisd_ros.decoding.hybrid import open_warm_store

            # One embedded store per process, shared by every method's decoder (each keeps
            # its own Retriever and episode memory); it is opened and warmed up once.
            ctx.opened_store = open_warm_store(ctx.db, ctx.resources.target, ctx.tasks or None)
        store = ctx.opened_store
    return build_decoder(name, replace(ctx.resources, store=store,
                                       retriever=None if store is not None else ctx.db))


#: HybridStep.msg router_mode constants -> names used in reports.
ROUTER_MODE_NAMES = {0: "drafter", 1: "retrieval", 2: "off"}


def step_record(result) -> dict:
    """JSON-friendly record of one decoded action for metrics and reports.

    ``result`` is an ``ActionResult`` or a hybrid result with a ``record``
    (``HybridStepRecord``); without one the router mode is "off" and nothing was skipped.
    ``hybrid`` holds the HybridStep fields (NaN as None) when there is a record.
    """
    stats, record = result.stats, getattr(result, "record", None)
    fields = None
    if record is not None:
        fields = {k: (None if isinstance(v, float) and v != v else v)
                  for k, v in record.to_msg_fields().items()}
    return {"tokens": np.asarray(result.tokens).tolist(),
            "bins": np.asarray(result.bins).tolist(),
            "action": np.asarray(result.action, dtype=float).tolist(),
            "target_forwards": int(stats.target_forwards),
            "drafter_forwards": int(stats.drafter_forwards),
            "retrieval_calls": int(stats.retrieval_calls),
            "accepted_lengths": [int(n) for n in stats.accepted_lengths],
            "tokens_from_draft": int(stats.tokens_from_draft),
            "first_error_position": int(stats.first_error_position),
            "draft_source": stats.draft_source,
            "router_mode": ROUTER_MODE_NAMES.get(getattr(record, "router_mode", 2), "off"),
            "verify_skipped": bool(getattr(record, "verify_skipped", False)),
            "status": str(getattr(record, "status", "")),
            "stage_ms": {k: float(v) for k, v in stats.stage_ms.items()},
            "counters": DecisionCounters.from_stats(stats).to_dict(),
            "hybrid": fields}


def check_record(verdict) -> dict:
    """JSON-friendly record of a check behind (``heisd_ros.decoding.behind.CheckVerdict``)."""
    return {"confirmed": bool(verdict.confirmed), "rule": verdict.rule,
            "bin_difference": int(verdict.bin_difference),
            "first_rejected_dim": int(verdict.first_rejected_dim),
            "target_bins": np.asarray(verdict.target_bins).tolist(),
            "check_ms": float(verdict.check_ms), "cpu_ms": float(verdict.cpu_ms)}


def start_episode(decoder, task: str | None = None) -> None:
    """Reset a decoder's per-episode state if it has any.

    Hybrid decoders get ``begin_episode(task)`` (``task`` = the retrieval DB collection, the
    task name ``heisd-build-db`` used); others ``reset()`` if they have it.
    """
    if callable(getattr(decoder, "begin_episode", None)):
        decoder.begin_episode(task)
    elif callable(getattr(decoder, "reset", None)):
        decoder.reset()


class DecoderPolicy:
    """A decoder as a simulator policy: ``act`` returns (action, step record).

    ``task`` is the task name handed to hybrid decoders at every episode start (their DB
    collection); set it before running episodes of another task.
    """

    def __init__(self, decoder, task: str | None = None):
        self.decoder = decoder
        self.task = task
        #: The episode as executed so far (every action ``act`` returns is executed).
        self.episode = EpisodeState(task)
        self._last_step: dict | None = None

    def reset(self) -> None:
        """Forward the episode start to decoders that keep history (router windows)."""
        self.episode = EpisodeState(self.task)
        self._last_step = None
        start_episode(self.decoder, self.task)

    def end_episode(self, success: bool) -> None:
        """Tell an adaptive decoder the episode's outcome (online skip threshold).

        A check behind still running on the last action is collected into its step record.
        """
        self.finish_checks()
        if callable(getattr(self.decoder, "episode_end", None)):
            self.decoder.episode_end(bool(success))

    def finish_checks(self) -> None:
        """Collect a check behind still running on the last action into its step record."""
        if callable(getattr(self.decoder, "collect_check", None)):
            self._attach_check(self.decoder.collect_check())

    def _attach_check(self, verdict) -> None:
        """Put a check-behind verdict into the record of the step whose action it checked."""
        if verdict is not None and self._last_step is not None:
            self._last_step["behind"] = check_record(verdict)

    def act(self, observation):
        """Decode one action; the step record goes to the runner's per-step stats.

        The observation gets this policy's :class:`EpisodeState` (the step, the gripper state
        after the last action, which the target's gripper rule and verify-skip need); the
        returned action counts as executed.
        """
        cpu_started = time.thread_time()
        result = self.decoder.decode(replace(observation, episode=self.episode))
        cpu_ms = (time.thread_time() - cpu_started) * 1e3
        self._attach_check(getattr(result, "behind", None))
        action = np.asarray(result.action, dtype=np.float64)
        self.episode = self.episode.executed(action)
        step = step_record(result)
        step["cpu_ms"] = cpu_ms
        self._last_step = step
        return action, step


def make_context(target_path: str | None, drafter_path: str | None, methods, seed: int = 0,
                 relaxed_radius_bins=DEFAULT_RELAXED_RADIUS_BINS, db_path: str | None = None,
                 calibration: str | None = None,
                 gripper_switch_prob: str | float | None = None,
                 retrieval_tree_nodes: int | None = None,
                 retrieval_deadline_ms: float | None = None,
                 skip_threshold: float | None = None,
                 router_threshold: float | None = None,
                 max_unverified_run: int | None = None,
                 follow_min_similarity: float | None = None,
                 router_min_points: int | None = None,
                 warn=None, choice=None,
                 openvla_options: dict | None = None) -> tuple[MethodContext, dict]:
    """(context, description) for the tools: the target and, if needed, a drafter.

    The target is ``choice`` (a ``heisd_ros.models.loading.TargetChoice``: the small VLA or
    an OpenVLA checkpoint, with ``openvla_options`` for fields without an option) when given,
    else the small VLA ``target_path``, else the shipped small VLA, else a seeded random init
    (``heisd_ros.models.loading.load_choice``). A draft head is loaded only when a method uses
    one: ``drafter_path``, else the shipped head for the shipped small VLA, else a seeded
    untrained head, with a warning (``warn``; default: a logging warning) and
    ``description["drafter_untrained"]`` True
    (``heisd_ros.models.draft_head_choice.choose_draft_head``). ``db_path`` is an embedded
    (edge) DB directory built by ``heisd-build-db``; router statistics are set per suite with
    :func:`router_stats_for`.
    ``gripper_switch_prob`` overrides the target's gripper decision rule (a probability, or
    "none" for plain greedy; None keeps the checkpoint's, see ``TargetVLA.greedy_bins``).
    ``retrieval_tree_nodes``: node budget of the hybrid methods' retrieval tree (None: default).
    ``retrieval_deadline_ms``: time budget of one retrieval query (0: none; None: default).
    ``skip_threshold``: the verify-skip threshold over the calibration's (None: its own).
    ``router_threshold``: the router's threshold on F over the calibration's (None: its own).
    ``max_unverified_run``: most unverified steps in a row, for every rule (None: defaults).
    ``follow_min_similarity``: the ``follow`` rule's least similarity of the followed
    demonstration's next point (None: default).
    ``router_min_points``: fewest EE positions from which the router decides (None: a full
    window).
    """
    from heisd_ros.models.draft_head_choice import choose_draft_head
    from heisd_ros.models.loading import TargetChoice, load_choice

    choice = choice or TargetChoice(path=target_path)
    target, target_desc = load_choice(choice, seed, gripper_switch_prob, openvla_options)
    drafter, drafter_desc, untrained = None, None, False
    if needs_head(methods):
        # OpenVLA: no file to compare a head's card with; its fingerprint decides.
        head = choose_draft_head(target, choice.small_vla_file(), drafter_path, seed,
                                 warn or _warn_stderr)
        drafter, drafter_desc, untrained = head.head, head.description, head.untrained
    retrieval_tree = None
    if retrieval_tree_nodes is not None:
        from heisd_ros.decoding.retrieval_tree import GroupTreeConfig

        try:
            retrieval_tree = GroupTreeConfig(node_budget=retrieval_tree_nodes)
        except ValueError as err:
            raise ValueError(f"--retrieval-tree-nodes: {err}") from err
    if skip_threshold is not None and not -1.0 <= float(skip_threshold) <= 1.0:  # NaN too
        raise ValueError(f"--skip-threshold: expected a cosine similarity in [-1, 1], got "
                         f"{skip_threshold}")
    if router_threshold is not None and not 0.0 <= float(router_threshold) <= 1.0:  # NaN too
        raise ValueError(f"--router-threshold: expected a threshold on F in [0, 1], got "
                         f"{router_threshold}")
    options = {}
    if max_unverified_run is not None or follow_min_similarity is not None:
        from heisd_ros.decoding.unverified import UnverifiedConfig

        unverified = UnverifiedConfig()
        for option, change in (("--max-unverified-run", {"max_run": max_unverified_run}),
                               ("--follow-min-similarity",
                                {"follow_min_similarity": follow_min_similarity})):
            try:
                unverified = unverified.overridden(**change)
            except ValueError as err:
                raise ValueError(f"{option}: {err}") from err
        options["unverified"] = unverified
    if router_min_points is not None:
        from heisd_ros.kinematics.router import RouterConfig

        try:
            # the window comes from the router statistics; more points than it: a full window
            n = int(router_min_points)
            options["router"] = RouterConfig(window=max(RouterConfig().window, n), min_points=n)
        except ValueError as err:
            raise ValueError(f"--router-min-points: {err}") from err
    retrieval = None
    if retrieval_deadline_ms is not None:
        from heisd_ros.decoding.retrieval_source import RetrievalSourceConfig

        try:
            retrieval = RetrievalSourceConfig(deadline_s=float(retrieval_deadline_ms) / 1e3)
        except ValueError as err:
            raise ValueError(f"--retrieval-deadline-ms: {err}") from err
    db = None
    if db_path and any(m in HYBRID_METHODS for m in methods):
        from pathlib import Path

        from heisd_ros.retrieval.store_config import StoreConfig

        if not Path(db_path).is_dir():
            raise ValueError(f"--db: {db_path} is not a directory (build one with "
                             f"heisd-build-db)")
        db = StoreConfig(backend="edge", path=str(db_path))
    ctx = MethodContext(DecoderResources(
        target, draft_head=drafter, calibration=calibration,
        relaxed_radius_bins=tuple(relaxed_radius_bins), retrieval=retrieval,
        retrieval_tree=retrieval_tree, skip_threshold=skip_threshold,
        router_threshold=router_threshold, options=options), db=db)
    return ctx, {"target": target_desc, "drafter": drafter_desc,
                 "drafter_untrained": untrained, "db": db_path, "calibration": calibration}


def _warn_stderr(message: str) -> None:
    # Python's last-resort handler writes WARNING records to stderr when none is configured.
    logging.getLogger("heisd_ros.eval").warning("WARNING: %s", message)


def context_from_args(args, methods, warn=None,
                      closed_loop: bool = False) -> tuple[MethodContext, dict]:
    """:func:`make_context` from the options of ``add_decoder_arguments`` (eval, replay, record).

    ``--model``/``--checkpoint``/... choose the target (``TargetChoice.from_args``;
    ``closed_loop``: an OpenVLA target on a CPU needs ``--allow-cpu``); ``--target`` unset:
    the shipped small VLA; ``--drafter`` unset: its shipped draft head (an untrained head,
    with a warning, for any other target). ``args.openvla_options`` (a dict, no flag) adds
    ``OpenVLAOptions`` fields.
    """
    from heisd_ros.models.loading import TargetChoice

    return make_context(args.target, args.drafter, methods, args.seed, db_path=args.db,
                        choice=TargetChoice.from_args(args, closed_loop),
                        openvla_options=getattr(args, "openvla_options", None),
                        calibration=args.calibration,
                        gripper_switch_prob=args.gripper_switch_prob,
                        retrieval_tree_nodes=args.retrieval_tree_nodes,
                        retrieval_deadline_ms=args.retrieval_deadline_ms,
                        skip_threshold=args.skip_threshold,
                        router_threshold=getattr(args, "router_threshold", None),
                        max_unverified_run=args.max_unverified_run,
                        follow_min_similarity=getattr(args, "follow_min_similarity", None),
                        router_min_points=getattr(args, "router_min_points", None),
                        warn=warn)


def router_stats_for(suite: str | None, explicit: str | None, db_path: str | None) -> str | None:
    """Router statistics JSON: ``explicit``, else ``<db>/router_stats_<suite>.json`` if present.

    Returns None when neither exists (router methods then fail with a message naming it).
    """
    from heisd_ros.kinematics.router import router_stats_file

    if explicit:
        return explicit
    if db_path and suite:
        path = router_stats_file(db_path, suite)
        if path.is_file():
            return str(path)
    return None
