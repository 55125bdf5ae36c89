"""Decoders by method name for the policy node: one ``decode(observation)`` seam for all.

``ar`` and ``drafter`` are :class:`heisd_ros.decoding.decoder.ActionDecoder` (AR greedy, and
EAGLE-2 drafts with exact acceptance); every other name of
``heisd_ros.decoding.hybrid.METHODS`` (``retrieval``, ``router_only``, ``router_skip``,
``heisd``, ``drafter_relaxed``) is the :class:`~heisd_ros.decoding.hybrid.HybridDecoder`,
imported only when asked for. Both come back as a :class:`DecodedStep` with the EECommand
source, the strict-gripper flag and the ``HybridStep`` fields, so the node has one path.

Strict gripper: ``gripper_from_target`` is True when the target VLA produced the gripper
token, which holds for AR, for exact drafts and for every verified hybrid step (the hybrid's
acceptance rules never take a draft gripper token that differs from the target's); it is
False for a verify-skipped retrieval draft, which the target never saw.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from heisd_ros.robot.base import CommandSource

BASIC_METHODS = ("ar", "drafter")
# HybridStep constants (msg/HybridStep.msg).
ROUTER_OFF, DRAFT_NONE, DRAFT_DRAFTER, DRAFT_RETRIEVAL = 2, 0, 1, 2


@dataclass(frozen=True)
class ModelConfig:
    """Which models the policy loads (parameters ``model.*``).

    Attributes:
        path: small-VLA safetensors; "" = the shipped weights, else a seeded random init.
        drafter_path: draft-head safetensors; "" = an untrained head (drafting still runs,
            exactly: the output equals AR, only slower).
        router_stats_path: router statistics JSON, as heisd-build-db writes it next to the DB
            (``router_stats_<suite>.json``); the router methods need it, "" = none.
        calibration_path: verify-skip calibration JSON; "" = the configured thresholds.
        random_seed: seed of the random initialisations.
        threads: torch CPU threads; 0 = torch's default.
        retrieval_k: retrieval candidates per step.
        retrieval_deadline_s: budget of one retrieval call, s.
    """

    path: str = ""
    drafter_path: str = ""
    router_stats_path: str = ""
    calibration_path: str = ""
    random_seed: int = 0
    threads: int = 1
    retrieval_k: int = 4
    retrieval_deadline_s: float = 0.05

    def __post_init__(self) -> None:
        if self.threads < 0:
            raise ValueError(f"threads: expected >= 0, got {self.threads}")
        if not 1 <= self.retrieval_k <= 256:
            raise ValueError(f"retrieval_k: expected 1..256, got {self.retrieval_k}")
        if not (math.isfinite(self.retrieval_deadline_s) and self.retrieval_deadline_s >= 0):
            raise ValueError(f"retrieval_deadline_s: expected >= 0 s, "
                             f"got {self.retrieval_deadline_s}")


@dataclass
class DecodedStep:
    """One decoded action in the node's terms.

    Attributes:
        action: (7,) physical action (m, rad, gripper 0/1).
        bins: (7,) bins 0..255.
        source: who produced the arm part (EECommand.SOURCE_*).
        gripper_from_target: the target VLA produced the gripper token (module docstring).
        fields: HybridStep fields (router, draft source, counters, ``<stage>_ms``, status).
    """

    action: np.ndarray
    bins: np.ndarray
    source: CommandSource
    gripper_from_target: bool
    fields: dict[str, Any] = field(default_factory=dict)


class BasicDecoder:
    """``ar`` / ``drafter``: an ActionDecoder behind the node's seam."""

    def __init__(self, decoder) -> None:
        self.decoder = decoder

    def begin_episode(self, task: str | None = None) -> None:
        """Nothing is kept between actions."""

    def episode_end(self, success: bool) -> None:
        """Nothing adapts to outcomes."""

    def decode(self, observation) -> DecodedStep:
        """Decode one action (the target produced every token it verified)."""
        result = self.decoder.decode(observation)
        stats = result.stats
        drafted = bool(stats.draft_source)
        fields = {
            "router_mode": ROUTER_OFF, "draft_source": DRAFT_DRAFTER if drafted else DRAFT_NONE,
            "verify_skipped": False, "accepted_tokens": stats.tokens_from_draft,
            "accepted_length_per_round": list(stats.accepted_lengths),
            "first_error_position": stats.first_error_position,
            "target_forwards": stats.target_forwards, "drafter_forwards": stats.drafter_forwards,
            "retrieval_calls": stats.retrieval_calls,
            **{f"{k}_ms": float(v) for k, v in stats.stage_ms.items()},
        }
        return DecodedStep(np.asarray(result.action, dtype=np.float64),
                           np.asarray(result.bins, dtype=np.int64),
                           CommandSource.DRAFTER if drafted else CommandSource.AR, True, fields)


class HybridAdapter:
    """A HybridDecoder behind the node's seam."""

    def __init__(self, decoder) -> None:
        self.decoder = decoder

    def begin_episode(self, task: str | None = None) -> None:
        """New episode: forget the EE history, gripper state and demotions."""
        self.decoder.begin_episode(task)

    def episode_end(self, success: bool) -> None:
        """Adapt the verify-skip threshold."""
        self.decoder.episode_end(success)

    def decode(self, observation) -> DecodedStep:
        """Decode one action along the route the hybrid picks."""
        result = self.decoder.decode(observation)
        fields = result.record.to_msg_fields()
        skipped = bool(fields.get("verify_skipped"))
        draft = fields.get("draft_source", DRAFT_NONE)
        if skipped:
            source = CommandSource.RETRIEVAL_SKIP
        elif draft == DRAFT_RETRIEVAL:
            source = CommandSource.RETRIEVAL
        elif draft == DRAFT_DRAFTER:
            source = CommandSource.DRAFTER
        else:
            source = CommandSource.AR
        return DecodedStep(np.asarray(result.action, dtype=np.float64),
                           np.asarray(result.bins, dtype=np.int64), source, not skipped, fields)


def load_target(config: ModelConfig):
    """(target, description) of the configured VLA; raises with the reason on a bad path."""
    from heisd_ros.tools._common import load_target as load

    if config.threads:
        import torch

        torch.set_num_threads(config.threads)
    return load(config.path or None, seed=config.random_seed)


def build_decoder(method: str, target, config: ModelConfig, retrieval_client=None):
    """The decoder of ``method`` on ``target`` (a retrieval client for retrieval methods).

    Raises:
        ValueError: unknown method (the valid names are listed), or a model file that does
            not fit; FileNotFoundError: a missing file; ImportError: the hybrid decoder is
            not available in this installation.
    """
    from heisd_ros.decoding.decoder import ActionDecoder

    head = _draft_head(target, config) if method != "ar" else None
    if method == "ar":
        return BasicDecoder(ActionDecoder(target))
    if method == "drafter":
        from heisd_ros.decoding.drafter_source import DrafterSource

        return BasicDecoder(ActionDecoder(target, DrafterSource(head, target)))
    try:
        from heisd_ros.decoding import hybrid
    except ImportError as exc:
        raise ImportError(f"method {method!r} needs heisd_ros.decoding.hybrid, which does not "
                          f"import here: {exc}; use one of {list(BASIC_METHODS)}") from exc
    if method not in hybrid.METHODS:
        raise ValueError(f"method: unknown method {method!r}; valid: "
                         f"{sorted(set(BASIC_METHODS) | set(hybrid.METHODS))}")
    if hybrid.METHODS[method].router and not config.router_stats_path:
        raise ValueError(f"model.router_stats_path: method {method!r} routes with router "
                         f"statistics; set it to the router_stats_<suite>.json that "
                         f"heisd-build-db wrote next to the DB")
    from heisd_ros.decoding.retrieval_source import RetrievalSourceConfig

    hybrid_config = hybrid.HybridConfig(retrieval=RetrievalSourceConfig(
        k=config.retrieval_k, deadline_s=config.retrieval_deadline_s))
    decoder = hybrid.build_hybrid_decoder(
        method, target, draft_head=head, retriever=retrieval_client,
        router_stats=config.router_stats_path or None,
        calibration=config.calibration_path or None, config=hybrid_config)
    return HybridAdapter(decoder)


def warm_up(target) -> None:
    """One AR decode of a black observation at configure time.

    Torch's first calls are slow (lazy kernel set-up); the first real step would pay for it.
    """
    from heisd_ros.data.observation import Observation
    from heisd_ros.decoding.decoder import ActionDecoder

    black = np.zeros((64, 64, 3), np.uint8)
    ActionDecoder(target).decode(Observation(black, black, "warm up"))


def _draft_head(target, config: ModelConfig):
    from heisd_ros.models.checkpoint import load_draft_head
    from heisd_ros.models.draft_head import DraftHead, DraftHeadConfig

    if config.drafter_path:
        return load_draft_head(config.drafter_path, target)
    import torch

    with torch.random.fork_rng():
        torch.manual_seed(config.random_seed)
        head = DraftHead(DraftHeadConfig.for_target(target))
    return head.to(dtype=target.language_model.dtype).eval()
