"""Decoding methods by name for the tools: the context they load, and the per-step record.

The method table is :data:`heisd_ros.decoding.methods.METHODS`; the tools (heisd-eval,
heisd-replay, heisd-record, heisd-collect) turn their options into
``heisd_ros.decoder_loader.DecoderOptions``, the one loader loads and checks the resources
into a :class:`MethodContext` (:func:`make_context`), and :func:`build_method` hands them to
``heisd_ros.decoding.builder.build_decoder``. Every decoder is a
``heisd_ros.decoding.interface.Decoder``; :class:`DecoderPolicy` runs one in closed loop.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from heisd_ros.data.observation import EpisodeState
from heisd_ros.decoder_loader import (
    CLI_NAMES,
    DecoderOptions,
    load_resources,
    open_warm_store,
    resolve_router_stats,
)
from heisd_ros.decoding.builder import DecoderResources
from heisd_ros.decoding.interface import ROUTER_MODE_NAMES
from heisd_ros.decoding.methods import HYBRID_METHODS, METHODS, check_method, check_methods
from heisd_ros.latency.counters import DecisionCounters

__all__ = ["DecoderPolicy", "MethodContext", "build_method", "check_methods", "context_from_args",
           "make_context"]


@dataclass
class MethodContext:
    """The tools' decoder resources, plus the embedded DB they open once per process.

    Attributes:
        resources: what every method's decoder is built from (target, draft head, router
            statistics, calibration, tree settings); :meth:`use_suite` sets ``router_stats``.
        options: the options the resources were loaded from.
        db: a ``StoreConfig`` of a DB to open in-process, a retrieval client (``Retriever``),
            or None (hybrid methods then degrade to the drafter / AR per step).
        tasks: the DB collections this process will query (empty = all); an in-process
            store loads only these, so worker processes sharing one DB never lock each
            other's shards.
        opened_store: the in-process store opened from ``db`` by the first hybrid method
            (None until then; :meth:`close` releases it).
    """

    resources: DecoderResources
    options: DecoderOptions = field(default_factory=DecoderOptions)
    db: Any = None
    tasks: tuple[str, ...] = ()
    opened_store: Any = None

    def use_suite(self, suite: str | None) -> str | None:
        """Router statistics of ``suite`` from here on (the loader's rule); returns the path.

        Explicit ones, else the DB's ``router_stats_<suite>.json`` if present, else None
        (router methods then fail with a message naming ``router_stats``).
        """
        self.resources.router_stats = resolve_router_stats(self.options, suite=suite).path
        return self.resources.router_stats

    def close(self) -> None:
        """Release the in-process store, if one was opened (its shard locks go with it)."""
        if self.opened_store is not None:
            self.opened_store.close()
            self.opened_store = None


def build_method(name: str, ctx: MethodContext):
    """The decoder of method ``name`` (ValueError listing the valid names if unknown)."""
    from heisd_ros.decoding.builder import build_decoder
    from heisd_ros.retrieval.store_config import StoreConfig

    check_method(name)
    store = None
    if METHODS[name].hybrid and isinstance(ctx.db, StoreConfig):
        if ctx.opened_store is None:
            # One embedded store per process, shared by every method's decoder (each keeps
            # its own Retriever and episode memory); it is opened and warmed up once.
            ctx.opened_store = open_warm_store(ctx.db, ctx.resources.target, ctx.tasks or None)
        store = ctx.opened_store
    return build_decoder(name, replace(ctx.resources, store=store,
                                       retriever=None if store is not None else ctx.db))


def step_record(result) -> dict:
    """JSON-friendly record of one decoded action (an ``ActionResult``) for metrics, reports.

    Without a path record (a plain decode) the router mode is "off", nothing was skipped and
    ``hybrid`` is None; with one, ``hybrid`` holds its HybridStep fields (NaN as None).
    """
    stats = result.stats
    fields = None
    if result.record is not None:
        fields = {k: (None if isinstance(v, float) and v != v else v)
                  for k, v in result.msg_fields().items()}
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
            "router_mode": ROUTER_MODE_NAMES.get(result.router_mode, "off"),
            "verify_skipped": result.verify_skipped,
            "status": str(result.status),
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
        # task = the retrieval DB collection, the task name heisd-build-db used
        self.decoder.begin_episode(self.task)

    def end_episode(self, success: bool) -> None:
        """Tell an adaptive decoder the episode's outcome (online skip threshold).

        A check behind still running on the last action is collected into its step record.
        """
        self.finish_checks()
        self.decoder.episode_end(bool(success))

    def finish_checks(self) -> None:
        """Collect a check behind still running on the last action into its step record."""
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
        self._attach_check(result.behind)
        action = np.asarray(result.action, dtype=np.float64)
        self.episode = self.episode.executed(action)
        step = step_record(result)
        step["cpu_ms"] = cpu_ms
        self._last_step = step
        return action, step


def make_context(methods, options: DecoderOptions | None = None, *,
                 target_path: str | None = None, choice=None, seed: int = 0,
                 gripper_switch_prob: str | float | None = None,
                 openvla_options: dict | None = None,
                 warn=None) -> tuple[MethodContext, dict]:
    """(context, description) for the tools: the target and what ``methods`` need.

    The target is ``choice`` (a ``heisd_ros.models.loading.TargetChoice``: the small VLA or
    an OpenVLA checkpoint, with ``openvla_options`` for fields without an option) when given,
    else the small VLA ``target_path``, else the shipped small VLA, else a seeded random init
    (``heisd_ros.models.loading.load_choice``); ``gripper_switch_prob`` overrides its gripper
    decision rule (a probability, or "none" for plain greedy; None keeps the checkpoint's).
    The rest comes from ``options`` through the loader
    (``heisd_ros.decoder_loader.load_resources``): a draft head only when a method uses one
    (an untrained one is warned about through ``warn``, default a logging warning, and flagged
    in ``description["drafter_untrained"]``), the calibration checked against the target.
    ``options.db_dir`` is an embedded (edge) DB directory built by ``heisd-build-db``; router
    statistics are set per suite with :meth:`MethodContext.use_suite`.

    Raises:
        ValueError: a bad option (named as ``options.names`` spells it), a draft head for
            another target, a calibration made for another model.
    """
    from heisd_ros.models.loading import TargetChoice, load_choice

    options = options or DecoderOptions(names=CLI_NAMES)
    choice = choice or TargetChoice(path=target_path)
    target, target_desc = load_choice(choice, seed, gripper_switch_prob, openvla_options)
    loaded = load_resources(target, methods, options, target_file=choice.small_vla_file(),
                            seed=seed, warn=warn or _warn_stderr)
    db = None
    if options.db_dir and any(m in HYBRID_METHODS for m in methods):
        from pathlib import Path

        from heisd_ros.retrieval.store_config import StoreConfig

        if not Path(options.db_dir).is_dir():
            raise ValueError(f"{options.name('db_dir')}: {options.db_dir} is not a directory "
                             f"(build one with heisd-build-db)")
        db = StoreConfig(backend="edge", path=str(options.db_dir))
    head = loaded.head
    return MethodContext(loaded.resources, options, db=db), {
        "target": target_desc, "drafter": head.description if head is not None else None,
        "drafter_untrained": bool(head is not None and head.untrained),
        "db": options.db_dir or None, "calibration": options.calibration_path or None}


def _warn_stderr(message: str) -> None:
    # Python's last-resort handler writes WARNING records to stderr when none is configured.
    logging.getLogger("heisd_ros.eval").warning("WARNING: %s", message)


def options_from_args(args) -> DecoderOptions:
    """The loader's options of ``add_decoder_arguments``' command line (eval, replay, record).

    Raises:
        ValueError: a bad value, named by its option (``--skip-threshold: ...``).
    """
    deadline_ms = args.retrieval_deadline_ms
    return DecoderOptions(
        drafter_path=args.drafter or "", db_dir=args.db or "",
        router_stats_path=getattr(args, "router_stats", None) or "",
        calibration_path=args.calibration or "",
        retrieval_tree_nodes=args.retrieval_tree_nodes,
        retrieval_deadline_s=float(deadline_ms) / 1e3 if deadline_ms is not None else None,
        skip_threshold=args.skip_threshold,
        router_threshold=getattr(args, "router_threshold", None),
        max_unverified_run=args.max_unverified_run,
        follow_min_similarity=getattr(args, "follow_min_similarity", None),
        router_min_points=getattr(args, "router_min_points", None),
        accept_token_max_bins=getattr(args, "accept_token_max_bins", None),
        accept_group_sum_max_bins=getattr(args, "accept_group_sum_max_bins", None),
        names=CLI_NAMES)


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

    options = options_from_args(args)
    return make_context(methods, options, choice=TargetChoice.from_args(args, closed_loop),
                        seed=args.seed, gripper_switch_prob=args.gripper_switch_prob,
                        openvla_options=getattr(args, "openvla_options", None), warn=warn)
