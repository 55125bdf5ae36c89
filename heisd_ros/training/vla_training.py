r"""Behaviour cloning of the small VLA on the simulator's demonstrations.

Each demonstration step (two camera images, instruction, optional proprio, expert action)
becomes one teacher-forced sequence, laid out exactly as ``SmallVLA.prefix`` lays out a
prompt at inference time::

    [bos] [primary patches] [wrist patches] [proprio?] "In: ...\nOut:" a_0 .. a_5
    (or, with ``prompt_layout="instruction_first"``, [bos] "In: ...\nOut:" [pad...]
    [primary patches] [wrist patches] [proprio?] a_0 .. a_5)

The hidden state that predicts action token k sits at position P - 1 + k (P = prompt
length); the loss is the cross-entropy over the 256 action logits only (the decoders' argmax
is restricted to them, see ``ActionTokenMap.argmax_token``). Prompts differ in length only
in their text part, so a batch is padded on the right: with causal attention the padding
never influences a real position, and the default position ids 0..L-1 are those of
inference.

The demonstrations come from :mod:`heisd_ros.training.demo_cache` (images already at the
model's resolution, the held-out split, per-step episode helpers).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import NamedTuple

import numpy as np
import torch
from torch.nn import functional as F

from heisd_ros.actions.bins import N_BINS
from heisd_ros.actions.normalization import ActionCodec, ActionStats
from heisd_ros.data.observation import ACTION_DIM
from heisd_ros.models.small_vla import SmallVLA
from heisd_ros.models.vision import _PIXEL_MEAN, _PIXEL_STD
from heisd_ros.training.demo_cache import DemoCache, gripper_change_steps

# The subgoal pathway's predictor (small_vla.SubgoalPathway): trained only on its own stage.
PATHWAY_PREDICTOR = ("subgoal.encoder.", "subgoal.head.")
PATHWAY_EMBED = "subgoal.embed."


@dataclass(frozen=True)
class VLATrainConfig:
    """Optimisation settings of ``heisd-train-vla``.

    Attributes:
        steps: optimiser steps; batch_size: sequences per step.
        lr, min_lr_ratio, warmup_steps, weight_decay, grad_clip: AdamW with linear warmup
            then cosine decay to ``lr * min_lr_ratio``.
        shift_px: random image translation (augmentation), up to this many pixels.
        seed: initialisation, batch order and augmentation.
        label_sigma_bins: > 0 trains the continuous dimensions on Gaussian soft labels of
            this width in bins around the expert's bin ("HL-Gauss", Imani & White 2018)
            instead of one-hot targets: neighbouring bins share the signal, so noisy
            demonstrations give a unimodal distribution whose argmax is stable. The gripper
            is always trained one-hot. Validation loss is always the one-hot cross-entropy.
        aux_weight: weight of the auxiliary vision objective (``vision_pretraining.py``)
            added to the action loss; 0 = none.
        freeze_vision: keep the main vision encoder fixed and train the projector, proprio
            encoder and decoder (and a subgoal pathway's embedding) only.
        gripper_change_weight: sampling weight of the steps around a gripper change (the
            step whose label differs from the previous step's and the
            ``gripper_change_span`` - 1 steps after it) relative to all others. A gripper
            change is about one step in a hundred, and the step before it looks like the
            steps it follows, so with uniform sampling a policy learns to copy the gripper
            state it sees and never closes on an object; 1 = uniform sampling.
        gripper_change_span: steps from a gripper change that get the weight.
        train_only: when not empty, only the model's parameters whose names start with one
            of these prefixes train (e.g. ``("subgoal.embed.",)``: only a subgoal pathway's
            embedding, so the decoder and both encoders stay as the starting model has
            them); the auxiliary head, if any, trains too. Not with ``freeze_vision``.
        pathway_lr_factor: the learning rate of the subgoal pathway's embedding
            (``small_vla.SubgoalPathway.embed``) relative to ``lr``. The embedding starts at
            zero and must grow to the scale of the proprio token it is added to, while a
            trained decoder is fine-tuned with a small rate; at the decoder's rate it stays
            too small to be read (a norm of 0.25 against the token's 5 after 3000 steps at
            1e-4).
        anchor_weight: weight of the anchor term (:class:`Anchor`, "learning without
            forgetting", Li & Hoiem 2016): the KL divergence from a fixed model's action
            distributions to the trained model's, on the batch's anchored steps, added to
            the action loss. 0 = none; > 0 needs an ``Anchor`` passed to the trainer.
    """

    steps: int = 3000
    batch_size: int = 32
    lr: float = 1e-3
    min_lr_ratio: float = 0.05
    warmup_steps: int = 100
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    shift_px: int = 2
    seed: int = 0
    label_sigma_bins: float = 0.0
    aux_weight: float = 0.0
    freeze_vision: bool = False
    gripper_change_weight: float = 1.0
    gripper_change_span: int = 3
    train_only: tuple[str, ...] = ()
    pathway_lr_factor: float = 1.0
    anchor_weight: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "train_only", tuple(self.train_only))
        if self.train_only and self.freeze_vision:
            raise ValueError("train_only: not with freeze_vision (name what trains instead)")
        if self.freeze_vision and self.aux_weight > 0:
            raise ValueError("freeze_vision: the auxiliary vision objective would train "
                             "nothing but its head; set aux_weight 0")
        if any(not isinstance(p, str) or not p for p in self.train_only):
            raise ValueError(f"train_only: expected non-empty name prefixes, got "
                             f"{self.train_only!r}")
        for name in ("steps", "batch_size", "gripper_change_span"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        for name in ("warmup_steps", "shift_px"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}: expected an int >= 0, got {value!r}")
        if not self.lr > 0:
            raise ValueError(f"lr: expected > 0, got {self.lr!r}")
        if not (math.isfinite(self.gripper_change_weight) and self.gripper_change_weight >= 1):
            raise ValueError(f"gripper_change_weight: expected a finite value >= 1, got "
                             f"{self.gripper_change_weight!r}")
        for name in ("aux_weight", "pathway_lr_factor", "anchor_weight"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}: expected a finite value >= 0, got {value!r}")
        if not self.label_sigma_bins >= 0:
            raise ValueError(f"label_sigma_bins: expected >= 0, got {self.label_sigma_bins!r}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio: expected 0..1, got {self.min_lr_ratio!r}")
        if not (self.weight_decay >= 0 and self.grad_clip > 0):
            raise ValueError(f"weight_decay/grad_clip: expected >= 0 / > 0, got "
                             f"{self.weight_decay!r} / {self.grad_clip!r}")

    def to_dict(self) -> dict:
        """Plain dict (stored in checkpoints and the card)."""
        return asdict(self)

    def lr_factor(self, step: int) -> float:
        """Multiplier of ``lr`` at optimiser step ``step`` (0-based)."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        span = max(1, self.steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        cosine = 0.5 * (1 + math.cos(math.pi * progress))
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * cosine


def encode_images(vla: SmallVLA, pixels: torch.Tensor,
                  words: torch.Tensor | None = None) -> torch.Tensor:
    """(B, 2, 3, S, S) normalised pixels -> (B, 2 * patches, H) vision tokens.

    The batched twin of ``TwoCameraEncoder.forward`` (same modules, same order); ``words``
    are the instructions' ids from ``TwoCameraEncoder.word_ids`` (needed with FiLM).
    """
    vision = vla.net.vision
    return vision.projector(vision.features(pixels, words)).reshape(pixels.shape[0], -1,
                                                                    vla.config.hidden_size)


def normalise_pixels(images: np.ndarray) -> torch.Tensor:
    """(B, 2, S, S, 3) uint8 -> (B, 2, 3, S, S) float pixels normalised like the encoder."""
    x = torch.as_tensor(images).permute(0, 1, 4, 2, 3).float() / 255.0
    return (x - _PIXEL_MEAN) / _PIXEL_STD


def soft_bin_targets(bins: torch.Tensor, sigma_bins: float) -> torch.Tensor:
    """(B, 7) bins -> (B, 7, N_BINS) target distributions over bins.

    Continuous dimensions get a discretised Gaussian of width ``sigma_bins`` centred on the
    bin (probability of each bin's [b - 0.5, b + 0.5] interval, renormalised over the bins);
    the gripper (last dimension) and ``sigma_bins == 0`` get one-hot targets.
    """
    one_hot = F.one_hot(bins, N_BINS).float()
    if sigma_bins <= 0:
        return one_hot
    edges = torch.arange(N_BINS + 1, dtype=torch.float32) - 0.5                    # (257,)
    z = (edges[None, None, :] - bins[..., None].float()) / (sigma_bins * math.sqrt(2.0))
    mass = 0.5 * (torch.erf(z[..., 1:]) - torch.erf(z[..., :-1]))                  # (B, 7, 256)
    soft = mass / mass.sum(-1, keepdim=True)
    soft[:, ACTION_DIM - 1] = one_hot[:, ACTION_DIM - 1]
    return soft


class ActionLoss(NamedTuple):
    """What :func:`action_loss` returns."""

    loss: torch.Tensor            # mean cross-entropy (or soft-label loss) over the tokens
    predicted: torch.Tensor       # (B, 7) argmax bins
    logits: torch.Tensor          # (B, 7, 256) action logits, column c = bin N_BINS - 1 - c


def action_loss(vla: SmallVLA, images: np.ndarray, prompts: list[list[int]], bins: np.ndarray,
                proprio: np.ndarray | None = None, label_sigma_bins: float = 0.0,
                features: torch.Tensor | None = None,
                words: torch.Tensor | None = None,
                subgoal_words: torch.Tensor | None = None) -> ActionLoss:
    """Loss, predicted bins and action logits of teacher-forced action tokens.

    Args:
        vla: the model (its ``net`` is run with autograd).
        images: (B, 2, S, S, 3) uint8 at the model resolution.
        prompts: per sample, ``vla.prompt_ids(instruction)`` (bos + text ids).
        bins: (B, 7) int target bins.
        proprio: (B, proprio_dim) float, used when the model has a proprio token.
        label_sigma_bins: soft-label width (see ``soft_bin_targets``); 0 = cross-entropy.
        features: ``TwoCameraEncoder.features`` of ``images`` if the caller has them already.
        words: ``TwoCameraEncoder.word_ids`` of the instructions (with instruction FiLM and
            no ``features``).
        subgoal_words: ``SubgoalPathway.word_ids`` of the instructions (required when the
            model has a subgoal pathway).
    """
    net, actions = vla.net, vla.actions
    emb = net.llm.get_input_embeddings()
    # Normalised once, for the encoder (unless the caller has its features) and the pathway.
    pixels = (normalise_pixels(images) if features is None or net.subgoal is not None
              else None)
    if features is None:
        vision = encode_images(vla, pixels, words)
    else:
        vision = net.vision.projector(features).reshape(len(prompts), -1, vla.config.hidden_size)
    vision = vision.to(emb.weight.dtype)
    b = len(prompts)
    bins_t = torch.as_tensor(np.asarray(bins), dtype=torch.long)
    targets = actions.token_of_bin(bins_t)                                        # (B, 7) ids
    step = [vision]
    pose = None  # the proprio vectors as a tensor (the pathway reads them too)
    if net.proprio is not None:
        pose = torch.as_tensor(np.asarray(proprio, dtype=np.float32))
        step.append(net.proprio(pose).unsqueeze(1))
    if vla.instruction_first:
        # [bos] [text, fixed slot] [vision] [proprio] a_0 .. a_5: every sample has one length.
        text = emb(torch.as_tensor(prompts, dtype=torch.long))
        parts = [text, *step, emb(targets[:, :ACTION_DIM - 1])]
        prompt_len = torch.full((b,), sum(part.shape[1] for part in parts[:-1]))
    else:
        # Text + the first 6 action tokens (the 7th is only predicted), right-padded.
        tails = [torch.cat([torch.as_tensor(p[1:], dtype=torch.long),
                            targets[i, :ACTION_DIM - 1]]) for i, p in enumerate(prompts)]
        width = max(len(t) for t in tails)
        tail_ids = torch.zeros(b, width, dtype=torch.long)
        for i, tail in enumerate(tails):
            tail_ids[i, :len(tail)] = tail
        parts = [emb(torch.full((b, 1), prompts[0][0], dtype=torch.long)), *step]
        head = sum(part.shape[1] for part in parts)          # positions before the text
        parts.append(emb(tail_ids))
        prompt_len = torch.as_tensor([head + len(p) - 1 for p in prompts])      # P per sample
    embeds = torch.cat(parts, dim=1)
    if net.subgoal is not None:
        # The pathway's prediction joins each sample's last prompt token (SmallVLA.prefix).
        if subgoal_words is None or subgoal_words.shape[0] != b:
            raise ValueError("action_loss: the model has a subgoal pathway; pass "
                             "subgoal_words (SubgoalPathway.word_ids of the instructions)")
        extra = net.subgoal(pixels, subgoal_words, pose)  # a pathway implies a proprio token
        at = F.one_hot(prompt_len - 1, embeds.shape[1]).to(embeds.dtype)           # (B, T)
        embeds = embeds + at[..., None] * extra.to(embeds.dtype)[:, None]
    hidden = net.llm.model(inputs_embeds=embeds).last_hidden_state
    where = prompt_len[:, None] - 1 + torch.arange(ACTION_DIM)[None]              # (B, 7)
    picked = hidden[torch.arange(b)[:, None], where]                              # (B, 7, H)
    logits = actions.action_logits(vla.lm_head(picked)).float()                   # (B, 7, 256)
    # Column c of the action logits is id first_id + c, i.e. bin N_BINS - 1 - c.
    columns = N_BINS - 1 - bins_t
    if label_sigma_bins > 0:
        target = soft_bin_targets(bins_t, label_sigma_bins).flip(-1)               # by column
        loss = -(target * F.log_softmax(logits, dim=-1)).sum(-1).mean()
    else:
        loss = F.cross_entropy(logits.reshape(-1, N_BINS), columns.reshape(-1))
    return ActionLoss(loss, N_BINS - 1 - logits.argmax(-1), logits)


class Batch(NamedTuple):
    """One training batch (``VLATrainer._batch``)."""

    images: np.ndarray                 # (B, 2, S, S, 3) uint8
    prompts: list[list[int]]           # bos + text ids per sample
    bins: np.ndarray                   # (B, 7) expert bins
    proprio: np.ndarray                # (B, 7)
    words: torch.Tensor | None         # (B, W) instruction word ids; None without FiLM
    subgoal_words: torch.Tensor | None  # (B, W) the subgoal pathway's ids; None without one


@dataclass(frozen=True)
class Anchor:
    """A fixed model the fine-tuned one is kept close to on some of the data.

    Fine-tuning a trained policy on a new suite forgets the old ones (every full fine-tune
    of the shipped model has lost static-suite successes). On the anchored steps (those of
    ``suites``) the trainer adds ``anchor_weight`` x the KL divergence from ``teacher``'s
    seven action-token distributions to the student's, on the same augmented images and
    teacher-forced expert tokens: the old behaviour is a target there, beside the
    demonstrations. The teacher needs the student's action bins.

    Attributes:
        teacher: the fixed model (usually the one the fine-tune starts from); never trained.
        suites: the suites whose steps are anchored (the episode name's first part).
    """

    teacher: SmallVLA
    suites: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "suites", tuple(self.suites))
        if not self.suites:
            raise ValueError("Anchor: name at least one suite whose steps are anchored")

    def mask(self, cache: DemoCache) -> np.ndarray:
        """(steps,) bool: the cache's steps whose episode belongs to an anchored suite."""
        suite_of = cache.episode_suites
        missing = sorted(set(self.suites) - set(suite_of.tolist()))
        if missing:
            raise ValueError(f"Anchor: no demonstrations of {missing} (the data has "
                             f"{sorted(set(suite_of.tolist()))})")
        return np.isin(suite_of[cache.episode], self.suites)


def anchor_kl(teacher_logits: torch.Tensor, student_logits: torch.Tensor) -> torch.Tensor:
    """Mean over samples and tokens of KL(teacher || student) of (B, 7, 256) action logits."""
    target = F.log_softmax(teacher_logits.float(), dim=-1)
    return F.kl_div(F.log_softmax(student_logits, dim=-1), target, log_target=True,
                    reduction="none").sum(-1).mean()


def _seeded(seed: int, build: Callable):
    """``build()`` with the torch RNG seeded by ``seed`` (the global RNG is left as it was)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return build()


class VLATrainer:
    """Mini-batch behaviour cloning with AdamW; its whole state is resumable."""

    def __init__(self, vla: SmallVLA, cache: DemoCache, train_index: np.ndarray,
                 config: VLATrainConfig, stats: ActionStats, anchor: Anchor | None = None):
        from heisd_ros.training.subgoal import subgoal_targets
        from heisd_ros.training.vision_pretraining import VisionAuxHead, aux_targets

        self.vla, self.cache, self.config = vla, cache, config
        if (anchor is None) != (config.anchor_weight == 0):
            raise ValueError("anchor: pass an Anchor exactly when anchor_weight > 0 (got "
                             f"weight {config.anchor_weight} and "
                             f"{'an' if anchor else 'no'} anchor)")
        self.anchor = anchor
        self.anchored = None  # (steps,) bool, the anchored steps
        if anchor is not None:
            theirs = getattr(anchor.teacher, "action_stats", None) or ActionStats()
            if not all(np.array_equal(getattr(theirs, k), getattr(stats, k))
                       for k in ("q01", "q99", "mask")):
                raise ValueError("anchor: the teacher's action bins differ from the "
                                 "student's; its distributions would be over other bins")
            self.anchored = anchor.mask(cache)
            anchor.teacher.net.eval()
            for param in anchor.teacher.net.parameters():
                param.requires_grad_(False)
            words = list(cache.episode_instructions)
            self.teacher_prompts = [anchor.teacher.prompt_ids(text) for text in words]
            self.teacher_words = anchor.teacher.net.vision.word_ids(words)
            pathway = anchor.teacher.net.subgoal
            self.teacher_subgoal_words = None if pathway is None else pathway.word_ids(words)
        self.train_index = np.asarray(train_index)
        self.codec = ActionCodec(stats)
        self.bins = np.stack([self.codec.encode(a) for a in cache.actions])
        self.prompts = [vla.prompt_ids(text) for text in cache.episode_instructions]
        instructions = list(cache.episode_instructions)
        self.words = vla.net.vision.word_ids(instructions)  # None without instruction FiLM
        # A subgoal pathway: its words and the targets of its own stage
        # (subgoal.pretrain_subgoal_pathway).
        pathway = vla.net.subgoal
        self.subgoal_words = self.pathway_targets = None
        if pathway is not None:
            self.subgoal_words = pathway.word_ids(instructions)
            self.pathway_targets = subgoal_targets(cache.actions[:, -1], cache.proprio[:, :3],
                                                   cache.episode)
        # The auxiliary vision objective (vision_pretraining.py), when it has a weight.
        self.aux_head = None
        if config.aux_weight > 0:
            self.aux_targets = aux_targets(self.bins, cache.actions, cache.proprio,
                                           cache.episode)
            self.aux_head = _seeded(config.seed, lambda: VisionAuxHead(vla))
        named = list(vla.net.named_parameters())
        trained = self._trained_names([n for n, _ in named])
        for n, p in named:
            p.requires_grad_(n in trained)
        named = [(n, p) for n, p in named if n in trained]
        if self.aux_head is not None:
            named += list(self.aux_head.named_parameters())
        vla.net.train()
        # Parameter groups: weight decay or not, times the learning-rate factor (the subgoal
        # pathway's embedding has its own, see VLATrainConfig.pathway_lr_factor).
        groups = []
        for factor, members in ((1.0, [(n, p) for n, p in named
                                       if not n.startswith(PATHWAY_EMBED)]),
                                (config.pathway_lr_factor,
                                 [(n, p) for n, p in named if n.startswith(PATHWAY_EMBED)])):
            for decay in (True, False):
                params = [p for _, p in members if (p.ndim >= 2) == decay]
                if params or factor == 1.0:
                    groups.append({"params": params, "lr_factor": factor,
                                   "weight_decay": config.weight_decay if decay else 0.0})
        self.optimizer = torch.optim.AdamW(groups, lr=config.lr)
        self.rng = np.random.default_rng(config.seed)
        self.step = 0
        self.last_loss = float("nan")
        self.sample_p = None  # uniform unless gripper changes are weighted
        if config.gripper_change_weight != 1:
            marked = gripper_change_steps(self.bins[:, -1], cache.episode,
                                          config.gripper_change_span)[self.train_index]
            weight = np.where(marked, config.gripper_change_weight, 1.0)
            self.sample_p = weight / weight.sum()

    def _trained_names(self, names: list[str]) -> set[str]:
        """The model parameters the action loss trains (``freeze_vision``, ``train_only``).

        A subgoal pathway's predictor (its encoder and head) is never among them: it keeps
        predicting subgoals (its own stage trains it) and the decoder learns to read it.
        """
        config = self.config
        if config.train_only:
            trained = {n for n in names if n.startswith(config.train_only)}
            if not trained:
                tops = sorted({".".join(n.split(".")[:2]) + "." for n in names})
                raise ValueError(f"train_only: no parameter name starts with "
                                 f"{list(config.train_only)}; the model has {tops}")
        elif config.freeze_vision:
            trained = {n for n in names
                       if not n.startswith("vision.") or n.startswith("vision.projector.")}
        else:
            trained = set(names)
        trained = {n for n in trained if not n.startswith(PATHWAY_PREDICTOR)}
        if not trained:
            raise ValueError("train_only: only the subgoal pathway's predictor was named, "
                             "which the action loss never trains (heisd-train-vla "
                             "--pathway-steps trains it)")
        return trained

    def _batch(self, index: np.ndarray, augment: bool):
        images = self.cache.images[index]
        shift = self.config.shift_px
        if augment and shift:
            # Random translation with edge padding, one offset per image.
            s = images.shape[2]
            padded = np.pad(images, ((0, 0), (0, 0), (shift, shift), (shift, shift), (0, 0)),
                            mode="edge")
            offsets = self.rng.integers(0, 2 * shift + 1, size=(*images.shape[:2], 2))
            images = np.stack([[padded[i, c, dy:dy + s, dx:dx + s]
                                for c, (dy, dx) in enumerate(offsets[i])]
                               for i in range(len(index))])
        episodes = self.cache.episode[index]
        prompts = [self.prompts[e] for e in episodes]
        rows = torch.as_tensor(episodes)
        words = None if self.words is None else self.words[rows]
        subgoal_words = None if self.subgoal_words is None else self.subgoal_words[rows]
        return Batch(images, prompts, self.bins[index], self.cache.proprio[index], words,
                     subgoal_words)

    def train_step(self) -> dict:
        """One optimiser step on a random batch; returns loss, accuracy and lr."""
        cfg = self.config
        index = self.rng.choice(self.train_index, size=cfg.batch_size, replace=False,
                                p=self.sample_p)
        batch = self._batch(index, augment=True)
        images, prompts, bins, proprio = batch.images, batch.prompts, batch.bins, batch.proprio
        lr = cfg.lr * cfg.lr_factor(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_factor", 1.0)  # a state saved before factors
        self.vla.net.train()
        features = self.vla.net.vision.features(normalise_pixels(images), batch.words)
        loss, predicted, logits = action_loss(self.vla, images, prompts, bins, proprio,
                                              cfg.label_sigma_bins, features=features,
                                              subgoal_words=batch.subgoal_words)
        correct = predicted == torch.as_tensor(bins)
        if self.aux_head is not None:
            from heisd_ros.training.vision_pretraining import aux_loss

            loss = loss + cfg.aux_weight * aux_loss(self.aux_head, features, proprio,
                                                    self.aux_targets[index])
        kl = None
        if self.anchor is not None:
            kl = self._anchor_term(index, batch, logits)
            if kl is not None:
                loss = loss + cfg.anchor_weight * kl
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for group in self.optimizer.param_groups
                                        for p in group["params"]], cfg.grad_clip)
        self.optimizer.step()
        self.step += 1
        self.last_loss = float(loss.detach())
        out = {"loss": self.last_loss, "acc": float(correct.float().mean()), "lr": lr}
        if kl is not None:
            out["anchor_kl"] = float(kl.detach())
        return out

    def teacher_logits(self, index: np.ndarray, batch: Batch) -> torch.Tensor:
        """The anchor's teacher's (B, 7, 256) action logits on ``batch`` (no gradient)."""
        teacher = self.anchor.teacher
        rows = torch.as_tensor(self.cache.episode[index])
        with torch.no_grad():
            return action_loss(
                teacher, batch.images, [self.teacher_prompts[e] for e in rows.tolist()],
                batch.bins, batch.proprio,
                words=None if self.teacher_words is None else self.teacher_words[rows],
                subgoal_words=(None if self.teacher_subgoal_words is None
                               else self.teacher_subgoal_words[rows])).logits

    def _anchored_kl(self, index: np.ndarray, batch: Batch,
                     logits: torch.Tensor) -> tuple[torch.Tensor | None, int]:
        """Mean KL(teacher || student) over the batch's anchored samples, and their number.

        ``logits``: the student's action logits on the whole ``batch`` (steps ``index``).
        """
        rows = np.flatnonzero(self.anchored[index])
        if not len(rows):
            return None, 0
        part = Batch(batch.images[rows], [batch.prompts[i] for i in rows], batch.bins[rows],
                     batch.proprio[rows], None, None)
        return anchor_kl(self.teacher_logits(index[rows], part),
                         logits[torch.as_tensor(rows)]), len(rows)

    def _anchor_term(self, index: np.ndarray, batch: Batch,
                     logits: torch.Tensor) -> torch.Tensor | None:
        """The loss's anchor term: the anchored samples' KL, as a share of the batch."""
        kl, n = self._anchored_kl(index, batch, logits)
        return None if kl is None else kl * (n / len(index))

    @torch.no_grad()
    def evaluate(self, index: np.ndarray, batch_size: int = 64) -> dict:
        """Loss and accuracy on ``index`` (no augment).

        Returns mean loss, per-token accuracy, whole-action accuracy and the mean absolute
        bin error per action dimension (``bin_error``, 7 values; the gripper's is the rate
        of wrong gripper tokens times its bin distance).
        """
        self.vla.net.eval()
        total, n, correct, exact = 0.0, 0, 0, 0
        bin_error, aux_total, pathway_total = np.zeros(ACTION_DIM), 0.0, 0.0
        kl_total, kl_n = 0.0, 0
        for start in range(0, len(index), batch_size):
            chunk = np.asarray(index[start:start + batch_size])
            batch = self._batch(chunk, augment=False)
            images, prompts, bins, proprio = batch.images, batch.prompts, batch.bins, batch.proprio
            features = self.vla.net.vision.features(normalise_pixels(images), batch.words)
            loss, predicted, logits = action_loss(self.vla, images, prompts, bins, proprio,
                                                  features=features,
                                                  subgoal_words=batch.subgoal_words)
            if self.anchor is not None:
                kl, anchored = self._anchored_kl(chunk, batch, logits)
                if anchored:
                    kl_total += float(kl) * anchored
                    kl_n += anchored
            if self.pathway_targets is not None:
                from heisd_ros.training.subgoal import pathway_loss

                pathway_total += float(pathway_loss(self.vla, batch,
                                                    self.pathway_targets[chunk])) * len(chunk)
            if self.aux_head is not None:
                from heisd_ros.training.vision_pretraining import aux_loss

                aux_total += float(aux_loss(self.aux_head, features, proprio,
                                            self.aux_targets[chunk])) * len(chunk)
            ok = predicted == torch.as_tensor(bins)
            total += float(loss) * len(chunk)
            n += len(chunk)
            correct += int(ok.sum())
            exact += int(ok.all(dim=1).sum())
            bin_error += np.abs(predicted.numpy() - np.asarray(bins)).sum(axis=0)
        self.vla.net.train()
        return {"loss": total / max(n, 1), "token_acc": correct / max(n * ACTION_DIM, 1),
                "action_acc": exact / max(n, 1), "samples": n,
                "bin_error": (bin_error / max(n, 1)).round(2).tolist(),
                **({"aux_loss": aux_total / max(n, 1)} if self.aux_head is not None else {}),
                **({"pathway_loss": pathway_total / max(n, 1)}
                   if self.pathway_targets is not None else {}),
                **({"anchor_kl": kl_total / kl_n} if kl_n else {})}

    def state_dict(self) -> dict:
        """Everything needed to continue exactly: weights, optimiser, step, batch RNG."""
        return {"model": self.vla.net.state_dict(), "optimizer": self.optimizer.state_dict(),
                "aux_head": None if self.aux_head is None else self.aux_head.state_dict(),
                "step": self.step, "rng": self.rng.bit_generator.state,
                "last_loss": self.last_loss, "config": self.config.to_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore a :meth:`state_dict` (the config must be the same)."""
        if state["config"] != self.config.to_dict():
            changed = sorted(k for k in state["config"]
                             if state["config"][k] != self.config.to_dict().get(k))
            if set(changed) - {"steps"}:
                raise ValueError(f"resume: training config differs in {changed}")
        self.vla.net.load_state_dict(state["model"])
        if self.aux_head is not None:
            self.aux_head.load_state_dict(state["aux_head"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = int(state["step"])
        self.rng.bit_generator.state = state["rng"]
        self.last_loss = float(state["last_loss"])


def train_stage(trainer: VLATrainer, params: list[torch.nn.Parameter],
                batch_loss: Callable, steps: int, batch_size: int, lr: float,
                progress: Callable | None = None, index: np.ndarray | None = None) -> list[float]:
    """A stage that trains only ``params`` on ``batch_loss(chosen, batch)`` for ``steps``.

    Draws from the trainer's batches (same augmentation, same batch RNG, so a seeded run is
    reproducible); AdamW with 50 warmup steps and cosine decay. ``index``: the demonstration
    steps to draw from (default: the trainer's training steps). ``params`` train even where
    the trainer froze them; their ``requires_grad`` is restored afterwards. Returns the loss
    of every step; ``progress(loss)`` is called after each.
    """
    pool = trainer.train_index if index is None else np.asarray(index)
    if len(pool) < batch_size:
        raise ValueError(f"train_stage: {len(pool)} steps to draw from, fewer than the batch "
                         f"size {batch_size}")
    frozen = [p for p in params if not p.requires_grad]
    for param in frozen:
        param.requires_grad_(True)
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    losses = []
    trainer.vla.net.train()
    try:
        for step in range(steps):
            warm = min(1.0, (step + 1) / 50)
            for group in optimizer.param_groups:
                group["lr"] = lr * warm * 0.5 * (1 + math.cos(math.pi * step / max(1, steps)))
            chosen = trainer.rng.choice(pool, size=batch_size, replace=False)
            loss = batch_loss(chosen, trainer._batch(chosen, augment=True))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            losses.append(float(loss.detach()))
            if progress is not None:
                progress(losses[-1])
    finally:
        for param in frozen:
            param.requires_grad_(False)
    return losses


def closed_loop_success(vla: SmallVLA, codec: ActionCodec, suites: list[str],
                        episodes_per_task: int, seed: int, image_size_px: int,
                        max_steps: int | None = None,
                        progress: Callable[[str, int], None] | None = None) -> dict:
    """Closed-loop AR success of ``vla`` on every task of ``suites`` (held-out seeds).

    Returns ``{suite: {"successes", "episodes", "success_rate", "wilson95", "tasks": {...}}}``
    plus ``"mean_over_suites"``; ``progress(task, successes)`` is called after each task.
    """
    from heisd_ros.decoding.decoder import ActionDecoder
    from heisd_ros.eval.metrics import wilson_interval
    from heisd_ros.sim.config import SimConfig
    from heisd_ros.sim.runner import run_episodes
    from heisd_ros.sim.suites import list_tasks

    decoder = ActionDecoder(vla, codec=codec)
    config = SimConfig(image_width_px=image_size_px, image_height_px=image_size_px)
    vla.net.eval()
    results: dict = {}
    for suite in suites:
        tasks, total = {}, 0
        for task in list_tasks(suite):
            run = run_episodes(lambda obs: decoder.decode(obs).action, suite, task,
                               episodes_per_task, seed, max_steps, config=config)
            tasks[task] = {"successes": run.successes, "episodes": len(run.episodes),
                           "mean_steps": float(np.mean([e.steps for e in run.episodes]))}
            total += run.successes
            if progress is not None:
                progress(f"{suite}/{task}", run.successes)
        n = episodes_per_task * len(tasks)
        results[suite] = {"successes": total, "episodes": n, "success_rate": total / n,
                          # z = 1.96, as the shipped card's figures were computed
                          "wilson95": wilson_interval(total, n, z=1.96), "tasks": tasks}
    results["mean_over_suites"] = float(np.mean([results[s]["success_rate"] for s in suites]))
    return results
