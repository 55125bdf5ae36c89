"""The one loader: decoder options -> ``DecoderResources``, checked against the loaded target.

Every front end fills a :class:`DecoderOptions` (the policy node from its ``model.*``
parameters in ``heisd_ros.nodes.policy_decoders``; heisd-eval, heisd-replay, heisd-record and
heisd-collect from the command line in ``heisd_ros.eval.methods``; heisd-bench) and calls
:func:`load_resources`; the decoders then come from
``heisd_ros.decoding.builder.build_decoder``. Here, and nowhere else:

- the draft head: explicit, else the shipped one for the shipped small VLA, else an untrained
  one with a warning (``heisd_ros.models.draft_head_choice``);
- the verify-skip calibration, read when a method is hybrid: explicit, else (for a router
  method, with ``calibration_from_db``) the DB directory's ``calibration.json``; refused when
  it was made for another model (its model fingerprint is not the target's);
- the router statistics: explicit, else the DB directory's ``router_stats_<suite>.json`` of a
  suite, or of a task's suite (:func:`resolve_router_stats`);
- an embedded DB, opened checked against the target's fingerprint and warmed up
  (:func:`open_warm_store`).

It sits beside ``heisd_ros.decoding``, not in it: it reads ``heisd_ros.calibration``, which
builds on decoding.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from heisd_ros.decoding.builder import DEFAULT_RELAXED_RADIUS_BINS, DecoderResources
from heisd_ros.decoding.methods import METHODS, check_method, needs_head
from heisd_ros.decoding.task_routed import Resolved

#: What ``heisd-build-db`` / ``heisd-calibrate`` name the calibration in a DB directory.
CALIBRATION_FILE = "calibration.json"
#: The options' names on the tools' command lines (for messages).
CLI_NAMES = {"drafter_path": "--drafter", "target": "--target", "db_dir": "--db",
             "router_stats_path": "--router-stats", "calibration_path": "--calibration",
             "retrieval_k": "--retrieval-k", "retrieval_deadline_s": "--retrieval-deadline-ms",
             "retrieval_tree_nodes": "--retrieval-tree-nodes", "skip_threshold": "--skip-threshold",
             "router_threshold": "--router-threshold", "max_unverified_run": "--max-unverified-run",
             "follow_min_similarity": "--follow-min-similarity",
             "router_min_points": "--router-min-points",
             "accept_token_max_bins": "--accept-token-max-bins",
             "accept_group_sum_max_bins": "--accept-group-sum-max-bins"}


@dataclass(frozen=True)
class DecoderOptions:
    """What a front end may choose about its decoders; checked on construction.

    Attributes:
        drafter_path: draft-head safetensors; "" = the shipped head or an untrained one.
        db_dir: DB directory of ``heisd-build-db`` (router statistics, calibration); "" = none.
        router_stats_path: router statistics JSON; "" = the DB's of the suite.
        calibration_path: verify-skip calibration JSON; "" = none, or the DB's (see next).
        calibration_from_db: without ``calibration_path``, router methods use the DB's
            ``calibration.json`` (the policy node); the tools take only an explicit one.
        relaxed_radius_bins: ``drafter_relaxed``'s radius per dimension (gripper last, 0).
        drafter_tree: ``DraftTreeConfig`` of the draft head's tree; None: its default.
        retrieval_k: retrieval candidates per step; None: the default.
        retrieval_deadline_s: budget of one retrieval query, s (0: none); None: the default.
        retrieval_tree_nodes: node budget of the retrieval tree; None: the default.
        skip_threshold: verify-skip threshold over the calibration's, in [-1, 1]; None: its.
        router_threshold: the router's threshold on F over the calibration's, in [0, 1].
        max_unverified_run: most unverified steps in a row, every rule; None: the defaults.
        follow_min_similarity: the follow rule's least similarity; None: the default.
        router_min_points: fewest EE positions the router decides from; None: a full window.
        accept_token_max_bins, accept_group_sum_max_bins: the sequence-wise relaxed
            acceptance of retrieval drafts (and of the checks behind): most bins one token, and
            a group's tokens together, may differ from the target's; None: the paper's 15 and
            30 (``GroupAcceptConfig``).
        names: how the front end spells each field (and ``target``) in messages.
    """

    drafter_path: str = ""
    db_dir: str = ""
    router_stats_path: str = ""
    calibration_path: str = ""
    calibration_from_db: bool = False
    relaxed_radius_bins: tuple[int, ...] = DEFAULT_RELAXED_RADIUS_BINS
    drafter_tree: Any = None
    retrieval_k: int | None = None
    retrieval_deadline_s: float | None = None
    retrieval_tree_nodes: int | None = None
    skip_threshold: float | None = None
    router_threshold: float | None = None
    max_unverified_run: int | None = None
    follow_min_similarity: float | None = None
    router_min_points: int | None = None
    accept_token_max_bins: int | None = None
    accept_group_sum_max_bins: int | None = None
    names: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.skip_threshold is not None and not -1.0 <= float(self.skip_threshold) <= 1.0:
            raise ValueError(f"{self.name('skip_threshold')}: expected a cosine similarity in "
                             f"[-1, 1], got {self.skip_threshold}")   # NaN too
        if self.router_threshold is not None and not 0.0 <= float(self.router_threshold) <= 1.0:
            raise ValueError(f"{self.name('router_threshold')}: expected a threshold on F in "
                             f"[0, 1], got {self.router_threshold}")
        self.retrieval_tree_config()
        self.hybrid_options()
        self.retrieval_config()

    def name(self, option: str) -> str:
        """How the front end calls ``option`` (its field name by default)."""
        return self.names.get(option, option)

    def _checked(self, option: str, make: Callable[[], Any]) -> Any:
        try:
            return make()
        except ValueError as err:
            raise ValueError(f"{self.name(option)}: {err}") from err

    def retrieval_tree_config(self):
        """``GroupTreeConfig`` of ``retrieval_tree_nodes``; None: the default tree."""
        if self.retrieval_tree_nodes is None:
            return None
        from heisd_ros.decoding.retrieval_tree import GroupTreeConfig

        return self._checked("retrieval_tree_nodes",
                             lambda: GroupTreeConfig(node_budget=self.retrieval_tree_nodes))

    def retrieval_config(self):
        """``RetrievalSourceConfig`` of K and the deadline; None: the default."""
        from heisd_ros.decoding.retrieval_source import RetrievalSourceConfig

        changes = {}
        if self.retrieval_k is not None:
            changes["k"] = self._checked(
                "retrieval_k", lambda: RetrievalSourceConfig(k=self.retrieval_k).k)
        if self.retrieval_deadline_s is not None:
            changes["deadline_s"] = self._checked(
                "retrieval_deadline_s",
                lambda: RetrievalSourceConfig(deadline_s=float(self.retrieval_deadline_s))
                .deadline_s)
        return RetrievalSourceConfig(**changes) if changes else None

    def hybrid_options(self) -> dict:
        """Further ``HybridConfig`` fields: unverified limits, router points, tolerances."""
        options = {}
        if self.accept_token_max_bins is not None or self.accept_group_sum_max_bins is not None:
            from heisd_ros.decoding.retrieval_accept import GroupAcceptConfig

            accept = GroupAcceptConfig()
            for option, key in (("accept_token_max_bins", "token_max_bins"),
                                ("accept_group_sum_max_bins", "group_sum_max_bins")):
                value = getattr(self, option)
                if value is not None:
                    if isinstance(value, bool) or int(value) != value:
                        raise ValueError(f"{self.name(option)}: expected a whole number of "
                                         f"bins, got {value!r}")
                    accept = self._checked(option, lambda a=accept, k=key, v=int(value):
                                           replace(a, **{k: v}))
            options["group_accept"] = accept
        if self.max_unverified_run is not None or self.follow_min_similarity is not None:
            from heisd_ros.decoding.unverified import UnverifiedConfig

            unverified = UnverifiedConfig()
            for option, change in (("max_unverified_run", {"max_run": self.max_unverified_run}),
                                   ("follow_min_similarity",
                                    {"follow_min_similarity": self.follow_min_similarity})):
                unverified = self._checked(option,
                                           lambda c=change, u=unverified: u.overridden(**c))
            options["unverified"] = unverified
        if self.router_min_points is not None:
            from heisd_ros.kinematics.router import RouterConfig

            n = int(self.router_min_points)
            # the window comes from the router statistics; more points than it: a full window
            options["router"] = self._checked(
                "router_min_points",
                lambda: RouterConfig(window=max(RouterConfig().window, n), min_points=n))
        return options


@dataclass
class Loaded:
    """What :func:`load_resources` loaded, and what for.

    Attributes:
        resources: for ``build_decoder``; ``router_stats`` is set per suite or task by the
            caller (:func:`resolve_router_stats`).
        head: the ``HeadChoice`` of the draft head (None: no method uses one).
        calibration: the calibration file used (``path`` None: none, ``note`` says why).
    """

    resources: DecoderResources
    head: Any
    calibration: Resolved


def load_resources(target, methods, options: DecoderOptions, *, target_file: Path | None = None,
                   seed: int = 0, warn: Callable[[str], None] | None = None, retriever=None,
                   store=None) -> Loaded:
    """The resources ``methods`` need on ``target``, loaded from ``options`` and checked.

    Args:
        target: the loaded target VLA.
        methods: the method names that will be built (each checked).
        options: the front end's options.
        target_file: the small-VLA file ``target`` came from (None: OpenVLA or a random init),
            whose sha256 a draft head's card must name.
        seed: seed of an untrained draft head.
        warn: gets a warning (an untrained draft head).
        retriever: a retrieval client for the hybrid methods, or None.
        store: an opened ``VectorStore`` to query in-process instead, or None.

    Raises:
        ValueError: an unknown method; a draft head for another target; a calibration that is
            not one, or that was made for another model.
        FileNotFoundError: a missing explicit file.
    """
    methods = [check_method(m) for m in methods]
    head = choose_head(target, options, target_file, seed, warn) if needs_head(methods) else None
    if any(METHODS[m].hybrid for m in methods):
        calibration = resolve_calibration(options, any(METHODS[m].router for m in methods))
    else:
        calibration = Resolved(None, "no calibration: no method uses one")
    resources = DecoderResources(
        target, draft_head=head.head if head is not None else None, retriever=retriever,
        store=store, calibration=load_calibration(calibration, target),
        relaxed_radius_bins=tuple(options.relaxed_radius_bins),
        drafter_tree=options.drafter_tree, retrieval=options.retrieval_config(),
        retrieval_tree=options.retrieval_tree_config(), skip_threshold=options.skip_threshold,
        router_threshold=options.router_threshold, options=options.hybrid_options())
    return Loaded(resources, head, calibration)


def choose_head(target, options: DecoderOptions, target_file: Path | None = None, seed: int = 0,
                warn: Callable[[str], None] | None = None):
    """The ``HeadChoice`` of the draft head: ``drafter_path``, else shipped, else untrained.

    The rule is :func:`heisd_ros.models.draft_head_choice.choose_draft_head`'s; ``warn`` gets
    the warning of an untrained head.
    """
    from heisd_ros.models.draft_head_choice import choose_draft_head

    return choose_draft_head(target, target_file, options.drafter_path or None, seed,
                             warn or (lambda _text: None), option=options.name("drafter_path"),
                             target_option=options.name("target"))


def resolve_calibration(options: DecoderOptions, router_method: bool = True) -> Resolved:
    """The verify-skip calibration: explicit, else the DB's (``calibration_from_db``)."""
    if options.calibration_path:
        return Resolved(options.calibration_path, options.name("calibration_path"),
                        explicit=True)
    if not (options.db_dir and options.calibration_from_db and router_method):
        return Resolved(None, "no calibration: the configured thresholds")
    path = Path(options.db_dir) / CALIBRATION_FILE
    if path.is_file():
        return Resolved(str(path), options.name("db_dir"))
    return Resolved(None, f"no {path} (heisd-calibrate writes it): the configured thresholds")


def load_calibration(resolved: Resolved, target):
    """The calibration of ``resolved`` (None: none), refused when made for another model.

    A calibration without a model fingerprint (written before calibrations carried one) is
    taken as it is.

    Raises:
        ValueError: not a calibration file, or its model fingerprint is not the target's
            (the message names both).
        FileNotFoundError: the file does not exist.
    """
    if resolved.path is None:
        return None
    from heisd_ros.calibration.verify_skip import VerifySkipCalibration
    from heisd_ros.retrieval.embedding import model_fingerprint

    calibration = VerifySkipCalibration.load(resolved.path)
    if calibration.model_fingerprint:
        ours = model_fingerprint(target)
        if calibration.model_fingerprint != ours:
            raise ValueError(f"{resolved.note}: {resolved.path} was calibrated for model "
                             f"{calibration.model_fingerprint}, the loaded target is {ours}; "
                             f"run heisd-build-db and heisd-calibrate for this target")
    return calibration


def suites_of_task(task: str) -> list[str]:
    """The simulator suites that have a task called ``task`` (empty for other tasks)."""
    from heisd_ros.sim.suites import list_suites, list_tasks

    return [suite for suite in list_suites() if task in list_tasks(suite)]


def resolve_router_stats(options: DecoderOptions, *, task: str | None = None,
                         suite: str | None = None) -> Resolved:
    """The router statistics: explicit, else the DB's of ``suite`` or of ``task``'s suite.

    A tool that knows its suite passes ``suite`` (None: no statistics from the DB). The policy
    node passes the ``task``: its suite is the simulator suite of ``task`` (a task name in
    several suites whose statistics are all there is ambiguous), else, for a task of no
    simulator suite (or none known yet, ""), the DB's only suite. None (with the reason)
    otherwise.
    """
    from heisd_ros.kinematics.router import ROUTER_STATS_PREFIX, router_stats_files

    stats_option, db_option = options.name("router_stats_path"), options.name("db_dir")
    if options.router_stats_path:
        return Resolved(options.router_stats_path, stats_option, explicit=True)
    if not options.db_dir:
        return Resolved(None, f"no router statistics ({db_option} and {stats_option} are "
                              f"empty)")
    db = Path(options.db_dir)
    where = repr(str(db.absolute()))
    if not db.is_dir():
        return Resolved(None, f"no router statistics ({db_option} {where} is not a directory; "
                              f"build it with heisd-build-db)")
    found = router_stats_files(db)
    if not found:
        return Resolved(None, f"no {ROUTER_STATS_PREFIX}<suite>.json in {db_option} {where} "
                              f"(heisd-build-db writes them)")
    if task is None:
        if suite in found:
            return Resolved(str(found[suite]), f"suite {suite!r}")
        return Resolved(None, f"no router statistics for suite {suite!r} in {where}, which has "
                              f"{sorted(found)}")
    known = suites_of_task(task) if task else []
    hits = [name for name in known if name in found]
    if len(hits) == 1:
        return Resolved(str(found[hits[0]]), f"suite {hits[0]!r} of task {task!r}")
    if len(hits) > 1:
        return Resolved(None, f"task {task!r} is in suites {hits}, all with router statistics "
                              f"in {where}; set {stats_option}")
    if not known and len(found) == 1:
        name, path = next(iter(found.items()))
        return Resolved(str(path), f"the DB's only suite, {name!r}")
    return Resolved(None, f"no router statistics for task {task!r} (suites {known or '?'}) in "
                          f"{where}, which has {sorted(found)}; set {stats_option}")


def open_warm_store(store_config, target, tasks=None):
    """Open ``store_config`` checked against ``target``'s fingerprint, then warm it up.

    Warming up is what the retrieval node does after opening: no control step pays for
    loading a shard. ``tasks`` limits it to the collections this process will query (those
    the DB has; None = all): an embedded shard is locked by the process that loaded it, so
    processes sharing one DB must each load only their own tasks. Open once per process and
    share the result.
    """
    from heisd_ros.retrieval.embedding import model_fingerprint
    from heisd_ros.retrieval.store import open_store

    store = open_store(store_config, model_fingerprint=model_fingerprint(target))
    if tasks is None:
        store.warm_up()
    else:
        present = set(store.list_collections())
        store.warm_up([task for task in tasks if task in present])
    return store
