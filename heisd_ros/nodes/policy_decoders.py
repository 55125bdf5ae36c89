"""Decoders by method name for the policy node: one ``decode(observation)`` seam for all.

The node's ``model.*`` parameters (:class:`ModelConfig`) become
``heisd_ros.decoder_loader.DecoderOptions``; the one loader,
``heisd_ros.decoder_loader.load_resources``, loads and checks the resources, and
``heisd_ros.decoding.builder.build_decoder``, the builder every tool uses, builds the decoder
of a method of the table ``heisd_ros.decoding.methods.METHODS``. Router methods choose their
router statistics per task (``heisd_ros.decoding.task_routed.TaskRoutedDecoder``). Every
decoder sits behind :class:`NodeDecoder`, which turns its ``ActionResult`` into a
:class:`DecodedStep` with the EECommand source, the strict-gripper flag and the ``HybridStep``
fields, so the node has one path.

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
  ``calibration.json``. A calibration made for another model is refused. A router method
  (``router_only``, ``router_skip``, ``heisd``, ``heisd_ar``) without router statistics runs
  as drafter SD (``heisd_ar``: AR): one warning per reason, and every HybridStep status says
  why.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from heisd_ros import decoder_loader as loader
from heisd_ros.decoding.interface import DRAFT_DRAFTER, DRAFT_RETRIEVAL
from heisd_ros.decoding.unverified import RULE_DEADLINE
from heisd_ros.kinematics.router import router_stats_files
from heisd_ros.robot.base import CommandSource

_LOG = logging.getLogger("heisd_ros.policy")
#: The ``model.*`` parameters by the loader's option names (for messages).
NODE_NAMES = {"drafter_path": "model.drafter_path", "db_dir": "model.db_dir",
              "router_stats_path": "model.router_stats_path",
              "calibration_path": "model.calibration_path",
              "accept_token_max_bins": "model.accept_token_max_bins",
              "accept_group_sum_max_bins": "model.accept_group_sum_max_bins"}


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
        accept_token_max_bins, accept_group_sum_max_bins: the relaxed acceptance of
            retrieval drafts and checks behind (``GroupAcceptConfig``): most bins a token,
            and a group's tokens together, may differ from the target's; -1 = the paper's
            15 and 30.
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
    accept_token_max_bins: int = -1
    accept_group_sum_max_bins: int = -1

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
        loader_options(self)   # the tolerances, checked by the loader, named as parameters

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


class NodeDecoder:
    """Any decoder behind the node's seam: ``decode`` gives a :class:`DecodedStep`.

    It also has the decode worker's ``submit``/``result``, run in the caller's thread
    (``decode_worker: false``), so the node's step loop is the same for both.

    Attributes:
        decoder: the ``heisd_ros.decoding.interface.Decoder``.
        description: what runs, with which files (for logs and diagnostics).
    """

    #: The node's own retrieval client answers for it (only a worker holds its own).
    retrieval_available = None

    def __init__(self, decoder, description: str = "") -> None:
        self.decoder = decoder
        self._description = description
        self._observation = None

    @property
    def description(self) -> str:
        """The decoder's own description (a router method's follows its task), else ours."""
        return self.decoder.description or self._description

    @property
    def degraded(self) -> str:
        """Why the decoder runs as less than asked ("": it does not; e.g. drafter SD)."""
        return self.decoder.degraded

    def begin_episode(self, task: str | None = None) -> None:
        """New episode: forget the EE history, gripper state and demotions."""
        self.decoder.begin_episode(task)

    def episode_end(self, success: bool) -> None:
        """Adapt the verify-skip threshold (decoders that have one)."""
        self.decoder.episode_end(success)

    def decode(self, observation) -> DecodedStep:
        """Decode one action; its command source says who produced the arm part."""
        result = self.decoder.decode(observation)
        fields = result.msg_fields()
        # A step completed at the deadline ran the target, but its last tokens (the gripper's
        # among them) are checked only behind: its command is marked as not verified.
        skipped = bool(fields.get("verify_skipped")) or fields.get("skip_rule") == RULE_DEADLINE
        draft = fields.get("draft_source")
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

    def submit(self, observation) -> None:
        """Decode ``observation`` at the next :meth:`result`."""
        self._observation = observation

    def result(self) -> DecodedStep:
        """The step of the submitted observation (decoded now, in this thread)."""
        observation, self._observation = self._observation, None
        return self.decode(observation)


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

    The loader's rule (:func:`heisd_ros.decoder_loader.choose_head`, the tools' too); an
    untrained head comes with a warning.

    Raises:
        ValueError: ``drafter_path`` names a head trained for another target (neither its
            card's sha256 nor its target fingerprint matches the loaded target), or does not
            fit the target.
        FileNotFoundError: ``drafter_path`` does not exist.
    """
    choice = loader.choose_head(target, loader_options(config), target_file(config),
                                config.random_seed, warn or _warn)
    return choice.head, choice.description


def loader_options(config: ModelConfig) -> loader.DecoderOptions:
    """The loader's options of the ``model.*`` parameters (-1: the defaults)."""
    return loader.DecoderOptions(
        drafter_path=config.drafter_path, db_dir=config.db_dir,
        router_stats_path=config.router_stats_path, calibration_path=config.calibration_path,
        calibration_from_db=True, retrieval_k=config.retrieval_k,
        retrieval_deadline_s=config.retrieval_deadline_s,
        max_unverified_run=config.max_unverified_run if config.max_unverified_run >= 0 else None,
        follow_min_similarity=(config.follow_min_similarity
                               if config.follow_min_similarity != -1.0 else None),
        accept_token_max_bins=(config.accept_token_max_bins
                               if config.accept_token_max_bins != -1 else None),
        accept_group_sum_max_bins=(config.accept_group_sum_max_bins
                                   if config.accept_group_sum_max_bins != -1 else None),
        names={**NODE_NAMES, "target": "model.checkpoint" if config.type == "openvla"
               else "model.path"})


def build_decoder(method: str, target, config: ModelConfig, retrieval_client=None,
                  warn: Callable[[str], None] | None = None) -> NodeDecoder:
    """The decoder of ``method`` on ``target`` (a retrieval client for retrieval methods).

    The loader loads the node's resources (draft head, calibration; router statistics per
    task) and :func:`heisd_ros.decoding.builder.build_decoder`, the builder every tool uses,
    builds it. The result has ``description`` (what runs, with which files) and ``degraded``
    ("" or why a router method runs as drafter SD). ``warn`` gets every warning (an untrained
    draft head, a degradation); default: the ``heisd_ros.policy`` Python logger.

    Raises:
        ValueError: unknown method (the valid names are listed), or a model file that does
            not fit (a draft head for another target, a calibration for another model);
            FileNotFoundError: a missing explicit file.
    """
    from heisd_ros.decoding import builder
    from heisd_ros.decoding.methods import METHODS, check_method
    from heisd_ros.decoding.task_routed import TaskRoutedDecoder

    switches = METHODS[check_method(method)]
    options = loader_options(config)
    loaded = loader.load_resources(target, [method], options, target_file=target_file(config),
                                   seed=config.random_seed, warn=warn or _warn,
                                   retriever=retrieval_client if switches.hybrid else None)
    head_desc = loaded.head.description if loaded.head is not None else "no draft head"
    resources = loaded.resources
    if not switches.hybrid:
        return NodeDecoder(builder.build_decoder(method, resources),
                           f"{method}: {head_desc}" if switches.drafter
                           else "ar: autoregressive greedy")
    if not switches.router:
        return NodeDecoder(builder.build_decoder(method, resources), f"{method}: {head_desc}")

    def make(router_stats: str | None):
        if router_stats is None:
            return builder.build_unrouted(method, resources)
        return builder.build_decoder(method, replace(resources, router_stats=router_stats))

    cal = loaded.calibration
    routed = TaskRoutedDecoder(method, make,
                               lambda task: loader.resolve_router_stats(options, task=task),
                               warn or _warn, f"{head_desc}; calibration: {cal.path or cal.note}")
    if config.router_stats_path or not router_stats_files(config.db_dir):
        routed.select(None)  # the same for every task: explicit (fails here if bad), or none
    return NodeDecoder(routed)


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
