"""Self-distillation of the draft head on the target's own greedy rollouts.

For each observation the target decodes its greedy action (AR); one teacher-forced forward
over prompt + 7 tokens gives the last-layer hidden states h_t of every position. The head
reads pairs (h_t, e_{t+1}) and is trained (EAGLE) with
    loss = feature_weight * SmoothL1(f_{t+1}, h_{t+1})            over all positions
         + ce_weight * CE(softmax_action(h), log_softmax_action(f))  at the 7 action positions
where the action positions are the hidden states whose lm_head output predicts action tokens
(t = P-1 .. P+5 for a prompt of P positions). Input features get Gaussian noise
(``feature_noise``) so the head tolerates its own imperfect features deeper in the tree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

import torch
from torch.nn import functional as F

from heisd_ros.data.observation import ACTION_DIM, Observation
from heisd_ros.decoding.decoder import ActionDecoder
from heisd_ros.models.draft_head import DraftHead
from heisd_ros.models.target import TargetVLA


@dataclass(frozen=True)
class DrafterTrainConfig:
    """Optimisation settings of ``heisd-train-drafter``."""

    steps: int = 600
    batch_size: int = 16
    lr: float = 1e-3
    feature_weight: float = 1.0
    ce_weight: float = 1.0
    feature_noise: float = 0.05
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name}: expected a positive int, got {getattr(self, name)!r}")
        for name in ("lr", "feature_weight", "ce_weight", "feature_noise"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}: expected >= 0, got {getattr(self, name)!r}")
        if self.lr == 0:
            raise ValueError("lr: expected > 0, got 0")

    def to_dict(self) -> dict:
        """Plain dict (stored in checkpoints and the card)."""
        return asdict(self)


@dataclass(frozen=True)
class Rollout:
    """Teacher-forcing data of one observation.

    Attributes: hidden (T, H) and embeds (T, H) of prompt + 7 tokens; prompt_length P;
    action_probs (7, 256) the target's distributions at the action positions; tokens (7,).
    """

    hidden: torch.Tensor
    embeds: torch.Tensor
    prompt_length: int
    action_probs: torch.Tensor
    tokens: torch.Tensor


@torch.no_grad()
def collect_rollouts(target: TargetVLA, observations: Iterable[Observation],
                     progress: Callable[[int], None] | None = None) -> list[Rollout]:
    """Greedy-decode each observation with the target and record its teacher-forcing data."""
    decoder, rollouts = ActionDecoder(target), []
    for obs in observations:
        tokens = decoder.decode(obs).tokens
        prefix = target.encode(obs)
        embeds = torch.cat([prefix.embeds, target.embed(tokens)], dim=1)
        hidden = target.language_model.model(inputs_embeds=embeds).last_hidden_state
        p = prefix.embeds.shape[1]
        logits = target.actions.action_logits(target.lm_head(hidden[0, p - 1:p + ACTION_DIM - 1]))
        rollouts.append(Rollout(hidden[0].float().cpu(), embeds[0].float().cpu(), p,
                                logits.float().softmax(-1).cpu(), torch.as_tensor(tokens)))
        if progress:
            progress(len(rollouts))
    return rollouts


def _batch(rollouts: list[Rollout]):
    """Right-padded (B, T-1, H) inputs/targets, a (B, T-1) validity mask and action indices."""
    t_max = max(r.hidden.shape[0] for r in rollouts) - 1
    b, h = len(rollouts), rollouts[0].hidden.shape[1]
    hidden_in, next_emb, target = (torch.zeros(b, t_max, h) for _ in range(3))
    valid = torch.zeros(b, t_max, dtype=torch.bool)
    for i, r in enumerate(rollouts):
        t = r.hidden.shape[0] - 1
        hidden_in[i, :t], next_emb[i, :t], target[i, :t] = r.hidden[:-1], r.embeds[1:], r.hidden[1:]
        valid[i, :t] = True
    # Draft output at t predicts h_{t+1}; action positions are h_{P-1} .. h_{P+5}.
    action_t = torch.stack([torch.arange(r.prompt_length - 2, r.prompt_length - 2 + ACTION_DIM)
                            for r in rollouts])
    probs = torch.stack([r.action_probs for r in rollouts])
    return hidden_in, next_emb, target, valid, action_t, probs


class DrafterTrainer:
    """Optimises a draft head on rollouts; its ``state_dict`` makes a run resumable."""

    def __init__(self, target: TargetVLA, head: DraftHead, config: DrafterTrainConfig,
                 rollouts: list[Rollout]):
        if not rollouts:
            raise ValueError("rollouts: need at least one training rollout")
        self.target, self.head, self.config, self.rollouts = target, head, config, rollouts
        self.optimizer = torch.optim.AdamW(head.parameters(), lr=config.lr, weight_decay=0.0)
        self.generator = torch.Generator().manual_seed(config.seed)
        self.step = 0
        self.last_loss = float("nan")
        rows = target.language_model.get_output_embeddings().weight
        self._action_rows = rows[target.actions.first_id:target.actions.vocab_base].detach().float()

    def state_dict(self) -> dict:
        """Everything needed to resume: head, optimizer, step, sampling RNG, config."""
        return {"head": self.head.state_dict(), "optimizer": self.optimizer.state_dict(),
                "step": self.step, "generator": self.generator.get_state(),
                "last_loss": self.last_loss, "config": self.config.to_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Resume; only ``steps`` may differ (to train an existing run for longer)."""
        saved = {k: v for k, v in (state.get("config") or {}).items() if k != "steps"}
        ours = {k: v for k, v in self.config.to_dict().items() if k != "steps"}
        if saved != ours:
            raise ValueError(f"resume: checkpoint config {saved} differs from this run's {ours}")
        self.head.load_state_dict(state["head"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        self.step, self.last_loss = state["step"], state["last_loss"]

    def train_step(self) -> dict[str, float]:
        """One optimiser step on a random batch; returns loss terms and top-1 agreement."""
        self.head.train()
        pick = torch.randint(len(self.rollouts), (self.config.batch_size,),
                             generator=self.generator)
        batch = _batch([self.rollouts[i] for i in pick])
        noise = torch.randn(batch[0].shape, generator=self.generator) * self.config.feature_noise
        # Rollouts live on the CPU; the step runs where the head is.
        device = self._action_rows.device
        hidden_in, next_emb, target, valid, action_t, probs = (t.to(device) for t in batch)
        noise = noise.to(device)
        b, t = valid.shape
        causal = torch.ones(t, t, dtype=torch.bool, device=device).tril()
        blocked = ~(causal[None] & valid[:, None, :])
        mask = torch.zeros(b, 1, t, t, device=device)
        mask = mask.masked_fill(blocked[:, None], torch.finfo(torch.float32).min)
        positions = torch.arange(t, device=device)[None].expand(b, t)
        pred = self.head(hidden_in + noise, next_emb, positions, mask)
        feature_loss = F.smooth_l1_loss(pred[valid], target[valid])
        pred_actions = pred[torch.arange(b, device=device)[:, None], action_t]   # (B, 7, H)
        log_q = torch.log_softmax(pred_actions @ self._action_rows.T, dim=-1)
        ce_loss = -(probs * log_q).sum(-1).mean()
        loss = self.config.feature_weight * feature_loss + self.config.ce_weight * ce_loss
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.step += 1
        self.last_loss = loss.item()
        top1 = (log_q.argmax(-1) == probs.argmax(-1)).float().mean()
        return {"loss": self.last_loss, "feature": feature_loss.item(), "ce": ce_loss.item(),
                "top1": top1.item()}


@torch.no_grad()
def heldout_acceptance(target: TargetVLA, head: DraftHead, observations: Iterable[Observation],
                       tree_config=None) -> dict[str, float]:
    """Drafter-exact decoding on held-out observations.

    Returns AL, target forwards per action, draft tokens per action, and the rate of actions
    equal to AR greedy (must be 1.0: exact acceptance is lossless).
    """
    from heisd_ros.decoding.drafter_source import DrafterSource

    head.eval()
    ar = ActionDecoder(target)
    sd = ActionDecoder(target, DrafterSource(head, target, tree_config))
    lengths, forwards, drafted, matches, n = [], 0, 0, 0, 0
    for obs in observations:
        result = sd.decode(obs)
        lengths += result.stats.accepted_lengths
        forwards += result.stats.target_forwards
        drafted += result.stats.tokens_from_draft
        matches += int((result.tokens == ar.decode(obs).tokens).all())
        n += 1
    if n == 0:
        raise ValueError("observations: the held-out set is empty")
    return {"actions": n, "al": sum(lengths) / max(len(lengths), 1),
            "target_forwards_per_action": forwards / n, "draft_tokens_per_action": drafted / n,
            "lossless_match_rate": matches / n}
