"""One builder for every front end: ``build_decoder(method, resources)``.

The node, ``heisd-eval``, ``heisd-replay``, ``heisd-record`` and ``heisd-bench`` load their
resources (files, command-line options, ROS parameters) with the one loader,
``heisd_ros.decoder_loader.load_resources``, into :class:`DecoderResources` and call
:func:`build_decoder`; what a method uses is the table ``heisd_ros.decoding.methods.METHODS``.
Every decoder is a :class:`~heisd_ros.decoding.interface.Decoder`.

- ``ar``, ``drafter``, ``drafter_relaxed``: an :class:`~heisd_ros.decoding.decoder.ActionDecoder`
  (AR greedy; draft-head trees with the exact rule or the Spec-VLA radius).
- the hybrid methods (``retrieval``, ``router_only``, ``router_skip``, ``heisd``,
  ``heisd_ar``): a :class:`~heisd_ros.decoding.hybrid.HybridDecoder`, imported only then.
  Without a retrieval client or store they degrade per step (drafter, else AR); a router
  method without router statistics is a ValueError naming ``router_stats``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from heisd_ros.decoding.methods import METHODS, check_method

#: The Spec-VLA relaxed rule's default radius in bins per dimension (gripper exact).
DEFAULT_RELAXED_RADIUS_BINS = (9, 9, 9, 9, 9, 9, 0)


@dataclass
class DecoderResources:
    """What a decoder may be built from (``heisd_ros.decoder_loader`` loads them).

    Attributes:
        target: the target VLA (``heisd_ros.models.target.TargetVLA``).
        draft_head: a ``DraftHead`` or None (draft methods need one; hybrid ones then use AR
            where they would draft).
        retriever: a retrieval client (``Retriever`` or the node's ROS service client) or None.
        store: an opened ``VectorStore`` to query in-process instead (each decoder gets its
            own ``Retriever`` over it); None: ``retriever``.
        router_stats: ``RouterStats`` or its JSON path; router methods need it.
        calibration: a loaded ``VerifySkipCalibration``, checked against the target by the
            loader, or None (the configured thresholds).
        relaxed_radius_bins: per-dimension radius of ``drafter_relaxed`` (gripper last, 0).
        drafter_tree: ``DraftTreeConfig`` of the draft head's tree; None: its default.
        retrieval: ``RetrievalSourceConfig`` (K, deadline); None: its default.
        retrieval_tree: ``GroupTreeConfig`` of the retrieval tree; None: its default.
        skip_threshold: the verify-skip similarity threshold over the calibration's; None:
            the calibration's (or the configured one without a calibration).
        router_threshold: the router's threshold on F over the calibration's (0: every step
            with a full window counts as fast and straight); None: the calibration's.
        options: further ``HybridConfig`` fields by name.
    """

    target: Any
    draft_head: Any = None
    retriever: Any = None
    store: Any = None
    router_stats: Any = None
    calibration: Any = None
    relaxed_radius_bins: tuple[int, ...] = DEFAULT_RELAXED_RADIUS_BINS
    drafter_tree: Any = None
    retrieval: Any = None
    retrieval_tree: Any = None
    skip_threshold: float | None = None
    router_threshold: float | None = None
    options: dict = field(default_factory=dict)


def _hybrid_config(method: str, res: DecoderResources):
    from heisd_ros.decoding import hybrid
    from heisd_ros.decoding.drafter_source import DraftTreeConfig

    config = hybrid.HybridConfig(method=method,
                                 relaxed_radius_bins=tuple(res.relaxed_radius_bins),
                                 drafter_tree=res.drafter_tree or DraftTreeConfig(),
                                 **res.options)
    if res.retrieval is not None:
        config = replace(config, retrieval=res.retrieval)
    if res.retrieval_tree is not None:
        config = replace(config, retrieval=replace(config.retrieval, tree=res.retrieval_tree))
    return config


def build_unrouted(method: str, resources: DecoderResources):
    """A router method's stand-in when it has no router statistics (the policy node's case).

    A ``HybridDecoder`` with the ``drafter`` components: drafter SD with ``resources``'
    draft head, AR without one (``heisd_ar``); its steps carry HybridStep records.
    """
    from heisd_ros.decoding import hybrid

    check_method(method)
    return hybrid.build_hybrid_decoder(
        "drafter", resources.target, draft_head=resources.draft_head,
        calibration=resources.calibration, config=_hybrid_config("drafter", resources))


def build_decoder(method: str, resources: DecoderResources):
    """The :class:`~heisd_ros.decoding.interface.Decoder` of ``method``.

    Raises:
        ValueError: an unknown method (the message lists the valid names), a draft method
            without a draft head, or a router method without router statistics.
    """
    check_method(method)
    switches, res = METHODS[method], resources
    if not switches.hybrid:
        from heisd_ros.decoding.decoder import ActionDecoder

        if not switches.drafter:
            return ActionDecoder(res.target)
        from heisd_ros.decoding.acceptance import RelaxedRule, exact_rule
        from heisd_ros.decoding.drafter_source import DrafterSource

        if res.draft_head is None:
            raise ValueError(f"methods: {method!r} needs a drafter (none was given)")
        rule = (RelaxedRule(tuple(res.relaxed_radius_bins)) if switches.drafter_relaxed
                else exact_rule)
        return ActionDecoder(res.target, DrafterSource(res.draft_head, res.target,
                                                       res.drafter_tree), rule)
    from heisd_ros.decoding import hybrid

    config = _hybrid_config(method, res)
    return hybrid.build_hybrid_decoder(
        method, res.target, draft_head=res.draft_head,
        retriever=None if res.store is not None else res.retriever, store=res.store,
        router_stats=res.router_stats, calibration=res.calibration, config=config,
        skip_threshold=res.skip_threshold, router_threshold=res.router_threshold)
