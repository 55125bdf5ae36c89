"""Decoders by method name for the policy node: one ``decode(observation)`` seam for all.

The node loads its resources (``model.*`` files, the retrieval client) and calls
:func:`heisd_ros.decoding.builder.build_decoder`, the builder every tool uses, for a method of
the table ``heisd_ros.decoding.methods.METHODS``. ``ar``, ``drafter`` and
``drafter_relaxed`` are :class:`heisd_ros.decoding.decoder.ActionDecoder` behind
:class:`BasicDecoder`; the hybrid methods (``retrieval``, ``router_only``, ``router_skip``,
``heisd``, ``heisd_ar``) are the :class:`~heisd_ros.decoding.hybrid.HybridDecoder` behind
:class:`HybridAdapter` (router methods: :class:`RoutedHybrid`). All come back as a
:class:`DecodedStep` with the EECommand source, the strict-gripper flag and the
``HybridStep`` fields, so the node has one path.

Strict gripper: ``gripper_from_target`` is True when the target VLA produced the gripper
token, which holds for AR, for exact drafts and for every verified hybrid step (the hybrid's
acceptance rules never take a draft gripper token that differs from the target's); it is
False for a verify-skipped retrieval draft, which the target never saw.

Which files (``model.*``):

- draft head: ``drafter_path``, else the shipped head (``heisd_ros/assets/
  draft_head.safetensors``) when the target is the VLA it was trained for (the shipped small
  VLA), else a seeded untrained head (exact, no speed-up; a warning says so). A head whose
  card names another target file (sha256) than the loaded one is refused. The rule is
  ``heisd_ros.models.draft_head_choice``'s, which the tools share.
- router statistics and calibration: the explicit ``router_stats_path`` /
  ``calibration_path`` (a file that cannot be read fails the configure step), else from
  ``db_dir`` (the DB directory, launch argument ``db``): ``router_stats_<suite>.json`` of the
  task's suite (resolved per task, so a new sim episode of another suite switches) and
  ``calibration.json``. A router method (``router_only``, ``router_skip``, ``heisd``,
  ``heisd_ar``) without router statistics runs as drafter SD (``heisd_ar``: AR): one warning
  per reason, and every HybridStep status says why (:class:`RoutedHybrid`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from heisd_ros.kinematics.router import ROUTER_STATS_PREFIX, router_stats_files
from heisd_ros.models import draft_head_choice as head_choice
from heisd_ros.robot.base import CommandSource

#: File names ``heisd-build-db`` / ``heisd-calibrate`` write in the DB directory.
CALIBRATION_FILE = "calibration.json"
_LOG = logging.getLogger("heisd_ros.policy")
# HybridStep constants (msg/HybridStep.msg).
ROUTER_OFF, DRAFT_NONE, DRAFT_DRAFTER, DRAFT_RETRIEVAL = 2, 0, 1, 2


@dataclass(frozen=True)
class ModelConfig:
    """Which models the policy loads (parameters ``model.*``).

    The target's fields are ``heisd_ros.models.loading.TargetChoice``'s, the tools' options
    (``--model``, ``--checkpoint``, ...), with "" for "not set".

    Attributes:
        type: the target VLA: "small" (the small VLA of ``path``) or "openvla" (the OpenVLA
            checkpoint directory ``checkpoint``).
        path: small-VLA safetensors; "" = the shipped weights, else a seeded random init.
        checkpoint: OpenVLA: the local checkpoint directory (never fetched from a hub).
        unnorm_key: OpenVLA: the dataset of ``dataset_statistics.json`` whose statistics
            un-normalise actions; "" = the only one.
        device: OpenVLA: "cuda", "cuda:1", "cpu"; "" = CUDA when available, else the CPU.
        dtype: OpenVLA: "bfloat16", "float16" or "float32"; "" = bfloat16 on CUDA, float32
            on a CPU.
        center_crop: OpenVLA: crop the central 90% of the image area first (checkpoints
            fine-tuned with random-crop augmentation, e.g. the LIBERO fine-tunes).
        vision_specs: OpenVLA: JSON of backbone sizes for a checkpoint whose backbones are not
            the ones its config.json names; "" = from config.json.
        allow_cpu: OpenVLA: run on the CPU (a 7B model takes seconds per action there: no
            control loop; debugging only). Without it an OpenVLA target whose device is the
            CPU is refused at start with the reason, before any weight is read.
        drafter_path: draft-head safetensors; "" = the shipped head when the target is the
            shipped small VLA, else an untrained head (exact: the output equals AR, slower).
        db_dir: DB directory from heisd-build-db (launch argument ``db``); the router
            statistics of the task's suite (``router_stats_<suite>.json``) and the
            verify-skip calibration (``calibration.json``) are read from it; "" = none.
        router_stats_path: router statistics JSON; "" = from ``db_dir`` per task (router
            methods without any run as drafter SD).
        calibration_path: verify-skip calibration JSON; "" = ``db_dir``'s, else the
            configured thresholds.
        random_seed: seed of the random initialisations.
        threads: torch CPU threads; 0 = torch's default.
        retrieval_k: retrieval candidates per step.
        retrieval_deadline_s: budget of one retrieval call, s.
        gripper_switch_prob: the target's gripper decision rule: the gripper changes state
            when the other state's total probability reaches this value in (0, 1) (the
            current state is the last command sent); "none" = plain greedy; "" = what the
            checkpoint carries.
        max_unverified_run: most steps executed without the target VLA in a row, then a
            verified one (``heisd_ros.decoding.unverified``); 0 = never unverified; -1 = the
            default (2).
        follow_min_similarity: the follow rule's least cosine similarity of the followed
            demonstration's next point (``UnverifiedConfig``); -1 = the default (0.90).
    """

    type: str = "small"
    path: str = ""
    checkpoint: str = ""
    unnorm_key: str = ""
    device: str = ""
    dtype: str = ""
    center_crop: bool = False
    vision_specs: str = ""
    allow_cpu: bool = False
    drafter_path: str = ""
    db_dir: str = ""
    router_stats_path: str = ""
    calibration_path: str = ""
    random_seed: int = 0
    threads: int = 1
    retrieval_k: int = 4
    retrieval_deadline_s: float = 0.05
    gripper_switch_prob: str = ""
    max_unverified_run: int = -1
    follow_min_similarity: float = -1.0

    def __post_init__(self) -> None:
        self.target_choice()  # raises naming the field
        if self.gripper_switch_prob:
            from heisd_ros.models.checkpoint import check_gripper_switch_probability

            check_gripper_switch_probability(self.gripper_switch_prob, "gripper_switch_prob")
        if self.threads < 0:
            raise ValueError(f"threads: expected >= 0, got {self.threads}")
        if not 1 <= self.retrieval_k <= 256:
            raise ValueError(f"retrieval_k: expected 1..256, got {self.retrieval_k}")
        if not (math.isfinite(self.retrieval_deadline_s) and self.retrieval_deadline_s >= 0):
            raise ValueError(f"retrieval_deadline_s: expected >= 0 s, "
                             f"got {self.retrieval_deadline_s}")
        if self.max_unverified_run < -1:
            raise ValueError(f"max_unverified_run: expected >= 0 (or -1: the method's "
                             f"default), got {self.max_unverified_run}")
        if not -1.0 <= self.follow_min_similarity <= 1.0:   # NaN too
            raise ValueError(f"follow_min_similarity: expected a cosine in (-1, 1] (or -1: the "
                             f"default), got {self.follow_min_similarity}")

    def target_choice(self):
        """The target these parameters name (``heisd_ros.models.loading.TargetChoice``)."""
        from heisd_ros.models.loading import TargetChoice

        return TargetChoice(model=self.type, path=self.path or None,
                            checkpoint=self.checkpoint or None,
                            unnorm_key=self.unnorm_key or None, device=self.device or None,
                            dtype=self.dtype or None, center_crop=self.center_crop,
                            vision_specs=self.vision_specs or None, allow_cpu=self.allow_cpu)


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

    def __init__(self, decoder, description: str = "") -> None:
        self.decoder = decoder
        self.description = description
        self.degraded = ""

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

    def __init__(self, decoder, description: str = "") -> None:
        self.decoder = decoder
        self.description = description
        self.degraded = ""

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


@dataclass(frozen=True)
class Resolved:
    """A file the policy uses (None: none) and where it came from, or why there is none."""

    path: str | None
    note: str
    explicit: bool = False


class RoutedHybrid:
    """A router method (``router_only``, ``router_skip``, ``heisd``) behind the node's seam.

    Router statistics belong to a task suite, and the task arrives with the episode (or the
    observation), so the decoder is chosen per task: one HybridDecoder per statistics file
    (each keeps its own online skip threshold), and a drafter-SD decoder when no statistics
    resolve, whose steps all carry the reason in their status (``HybridStep.status``).

    Attributes:
        method: the router method asked for.
        current: the HybridAdapter in use (None before the first task).
        degraded: "" while routing; else why this runs as drafter SD.
        description: what runs and with which files (for logs and diagnostics).
    """

    def __init__(self, method: str, make: Callable[[str | None], Any],
                 resolve: Callable[[str], Resolved], warn: Callable[[str], None] | None = None,
                 details: str = "") -> None:
        """Route per task.

        Args:
            method: the router method.
            make: ``make(stats_path or None)`` builds a HybridDecoder (None: drafter SD).
            resolve: ``resolve(task)`` finds the task's router statistics.
            warn: gets each new reason to run as drafter SD.
            details: the draft head and calibration, for :attr:`description`.
        """
        from heisd_ros.decoding.retrieval_source import task_of

        self.method = method
        self._make, self._resolve, self._warn = make, resolve, warn or _warn
        self._task_of = task_of
        self._details = details
        self._adapters: dict[str | None, HybridAdapter] = {}
        self._resolved: dict[str, Resolved] = {}
        self._warned: set[str] = set()
        self._task: str | None = None
        self.current: HybridAdapter | None = None
        self.degraded = ""
        self.description = f"{method}: router statistics per task (none chosen yet); {details}"

    def select(self, task: str | None) -> bool:
        """Use the decoder for ``task``'s router statistics; True when that changed it.

        Raises:
            OSError, ValueError: explicit router statistics that do not load.
        """
        key = task or ""
        res = self._resolved.get(key)
        if res is None:
            res = self._resolved[key] = self._resolve(key)
        adapter = self._adapters.get(res.path)
        if adapter is None:
            try:
                adapter = HybridAdapter(self._make(res.path))
            except (OSError, ValueError, KeyError) as exc:
                if res.explicit or res.path is None:
                    raise
                res = self._resolved[key] = Resolved(
                    None, f"router statistics {res.path} do not load ({exc})")
                adapter = self._adapters.get(None) or HybridAdapter(self._make(None))
            self._adapters[res.path] = adapter
        if res.path is None:
            self.degraded = f"{self.method} runs as drafter SD: {res.note}"
            self.description = f"{self.degraded}; {self._details}"
            if self.degraded not in self._warned:
                self._warned.add(self.degraded)
                self._warn(self.degraded)
        else:
            self.degraded = ""
            self.description = (f"{self.method}: router statistics {res.path} ({res.note}); "
                                f"{self._details}")
        changed, self.current = adapter is not self.current, adapter
        return changed

    def begin_episode(self, task: str | None = None) -> None:
        """New episode of ``task`` (None: the observations' task): reset, pick its decoder."""
        self._task = task
        if task:
            self.select(task)
        for adapter in self._adapters.values():
            adapter.begin_episode(task)

    def episode_end(self, success: bool) -> None:
        """Adapt the verify-skip threshold of the decoder that ran the episode."""
        if self.current is not None:
            self.current.episode_end(success)

    def decode(self, observation) -> DecodedStep:
        """Decode one action with the decoder of the observation's task."""
        if self.select(self._task or self._task_of(observation)):
            self.current.begin_episode(self._task)  # it was idle: start it fresh
        step = self.current.decode(observation)
        if self.degraded:
            own = step.fields.get("status")
            step.fields["status"] = f"{self.degraded}; {own}" if own else self.degraded
        return step


#: How the node's CPU refusal names the opt-in.
ALLOW_CPU = "model.allow_cpu: true (launch argument allow_cpu:=true)"


def load_target(config: ModelConfig):
    """(target, description) of the configured VLA; raises with the reason on a bad path.

    An OpenVLA target whose device is the CPU is refused without ``allow_cpu``
    (``heisd_ros.models.loading.check_device_allowed``), before any weight is read.
    """
    from heisd_ros.models.loading import load_choice

    if config.threads:
        import torch

        torch.set_num_threads(config.threads)
    return load_choice(config.target_choice(), config.random_seed,
                       config.gripper_switch_prob or None, opt_in=ALLOW_CPU)


def target_file(config: ModelConfig) -> Path | None:
    """The small-VLA file :func:`load_target` loads (None: OpenVLA, or a random init)."""
    return config.target_choice().small_vla_file()


def resolve_draft_head(config: ModelConfig, target, warn: Callable[[str], None] | None = None):
    """(draft head, description): ``drafter_path``, else the shipped head, else untrained.

    The rule is :func:`heisd_ros.models.draft_head_choice.choose_draft_head`'s (the tools
    use it too); an untrained head comes with a warning.

    Raises:
        ValueError: ``drafter_path`` names a head trained for another target (neither its
            card's sha256 nor its target fingerprint matches the loaded target), or does not
            fit the target.
        FileNotFoundError: ``drafter_path`` does not exist.
    """
    choice = head_choice.choose_draft_head(
        target, target_file(config), config.drafter_path, config.random_seed, warn or _warn,
        option="model.drafter_path",
        target_option="model.checkpoint" if config.type == "openvla" else "model.path")
    return choice.head, choice.description


def suites_of_task(task: str) -> list[str]:
    """The simulator suites that have a task called ``task`` (empty for other tasks)."""
    from heisd_ros.sim.suites import list_suites, list_tasks

    return [suite for suite in list_suites() if task in list_tasks(suite)]


def resolve_router_stats(config: ModelConfig, task: str) -> Resolved:
    """The router statistics for ``task``: explicit, else ``db_dir``'s for the task's suite.

    In ``db_dir``, the suite is the simulator suite of ``task`` (a task name in several
    suites whose statistics are all there is ambiguous), else, for a task of no simulator
    suite (or none known yet), the DB's only suite. None (with the reason) otherwise.
    """
    if config.router_stats_path:
        return Resolved(config.router_stats_path, "model.router_stats_path", explicit=True)
    if not config.db_dir:
        return Resolved(None, "no router statistics (model.db_dir, the launch argument db, "
                              "and model.router_stats_path are empty)")
    db = Path(config.db_dir)
    if not db.is_dir():
        return Resolved(None, f"no router statistics (model.db_dir {str(db.absolute())!r} is "
                              f"not a directory; build it with heisd-build-db)")
    found = router_stats_files(config.db_dir)
    if not found:
        return Resolved(None, f"no {ROUTER_STATS_PREFIX}<suite>.json in model.db_dir "
                              f"{str(db.absolute())!r} (heisd-build-db writes them)")
    known = suites_of_task(task) if task else []
    hits = [suite for suite in known if suite in found]
    if len(hits) == 1:
        return Resolved(str(found[hits[0]]), f"suite {hits[0]!r} of task {task!r}")
    if len(hits) > 1:
        return Resolved(None, f"task {task!r} is in suites {hits}, all with router statistics "
                              f"in {str(db.absolute())!r}; set model.router_stats_path")
    if not known and len(found) == 1:
        suite, path = next(iter(found.items()))
        return Resolved(str(path), f"the DB's only suite, {suite!r}")
    return Resolved(None, f"no router statistics for task {task!r} (suites {known or '?'}) in "
                          f"{str(db.absolute())!r}, which has {sorted(found)}; set "
                          f"model.router_stats_path")


def resolve_calibration(config: ModelConfig) -> Resolved:
    """The verify-skip calibration: explicit, else ``db_dir``'s ``calibration.json``."""
    if config.calibration_path:
        return Resolved(config.calibration_path, "model.calibration_path", explicit=True)
    if not config.db_dir:
        return Resolved(None, "no calibration: the configured thresholds")
    path = Path(config.db_dir) / CALIBRATION_FILE
    if path.is_file():
        return Resolved(str(path), "model.db_dir")
    return Resolved(None, f"no {path} (heisd-calibrate writes it): the configured thresholds")


def load_calibration(resolved: Resolved, target):
    """The calibration of ``resolved`` (None: none), refused when made for another model.

    Raises:
        ValueError: not a calibration file, or its model fingerprint is not the target's.
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


def build_decoder(method: str, target, config: ModelConfig, retrieval_client=None,
                  warn: Callable[[str], None] | None = None):
    """The decoder of ``method`` on ``target`` (a retrieval client for retrieval methods).

    This loads the node's resources (draft head, calibration, router statistics per task) and
    calls :func:`heisd_ros.decoding.builder.build_decoder`, the builder every tool uses.
    The result has ``description`` (what runs, with which files) and ``degraded`` ("" or
    why a router method runs as drafter SD). ``warn`` gets every warning (an untrained
    draft head, a degradation); default: the ``heisd_ros.policy`` Python logger.

    Raises:
        ValueError: unknown method (the valid names are listed), or a model file that does
            not fit (a draft head for another target, a calibration for another model);
            FileNotFoundError: a missing explicit file.
    """
    from heisd_ros.decoding import builder
    from heisd_ros.decoding.methods import METHODS, check_method

    switches = METHODS[check_method(method)]
    head, head_desc = (resolve_draft_head(config, target, warn) if switches.drafter
                       else (None, "no draft head"))
    if not switches.hybrid:
        resources = builder.DecoderResources(target, draft_head=head)
        return BasicDecoder(builder.build_decoder(method, resources),
                            f"{method}: {head_desc}" if switches.drafter
                            else "ar: autoregressive greedy")
    from heisd_ros.decoding.retrieval_source import RetrievalSourceConfig

    resources = builder.DecoderResources(
        target, draft_head=head, retriever=retrieval_client,
        retrieval=RetrievalSourceConfig(k=config.retrieval_k,
                                        deadline_s=config.retrieval_deadline_s))
    if config.max_unverified_run >= 0 or config.follow_min_similarity != -1.0:
        from heisd_ros.decoding.unverified import UnverifiedConfig

        resources.options["unverified"] = UnverifiedConfig().overridden(
            max_run=config.max_unverified_run if config.max_unverified_run >= 0 else None,
            follow_min_similarity=(config.follow_min_similarity
                                   if config.follow_min_similarity != -1.0 else None))
    if not switches.router:
        resources.calibration = load_calibration(
            resolve_calibration(replace(config, db_dir="")), target)
        return HybridAdapter(builder.build_decoder(method, resources), f"{method}: {head_desc}")
    cal = resolve_calibration(config)
    resources.calibration = load_calibration(cal, target)

    def make(router_stats: str | None):
        if router_stats is None:
            return builder.build_unrouted(method, resources)
        return builder.build_decoder(method, replace(resources, router_stats=router_stats))

    routed = RoutedHybrid(method, make, lambda task: resolve_router_stats(config, task), warn,
                          f"{head_desc}; calibration: {cal.path or cal.note}")
    if config.router_stats_path or not router_stats_files(config.db_dir):
        routed.select(None)  # the same for every task: explicit (fails here if bad), or none
    return routed


def warm_up(target) -> None:
    """One AR decode of a black observation at configure time.

    Torch's first calls are slow (lazy kernel set-up); the first real step would pay for it.
    """
    from heisd_ros.data.observation import Observation
    from heisd_ros.decoding.decoder import ActionDecoder

    black = np.zeros((64, 64, 3), np.uint8)
    ActionDecoder(target).decode(Observation(black, black, "warm up"))


def _warn(message: str) -> None:
    _LOG.warning("policy: WARNING: %s", message)
