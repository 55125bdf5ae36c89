"""The tiny models of the decoding-core tests and how they are made.

``test/conftest.py`` builds the shared fixtures from these (``tiny_random_vla``,
``tiny_trained_vla``, ``tiny_drafter``); tests import the helpers (``TINY``, ``scenes``,
``train_tiny_vla``, ``train_drafter``) from here. Tiny models keep the whole set fast on a
shared 2-core machine:
- a seeded random small VLA (2 layers, hidden 64);
- the same architecture trained briefly (teacher forcing) to emit scripted actions derived
  from the synthetic scenes, so its greedy choices depend on the image and the instruction and
  are confident;
- a draft head self-distilled from the trained one.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F

from heisd_ros.actions.normalization import ActionCodec
from heisd_ros.models.draft_head import DraftHead, DraftHeadConfig
from heisd_ros.models.small_vla import SmallVLA
from heisd_ros.models.small_vla_config import SmallVLAConfig
from heisd_ros.models.synthetic_scenes import SyntheticScenes
from heisd_ros.training.draft_training import DrafterTrainConfig, DrafterTrainer, collect_rollouts

# The CI machine has 2 shared cores; two intra-op threads contend and run ~5x slower here.
torch.set_num_threads(1)

TINY = SmallVLAConfig(image_size_px=32, patch_size_px=8, vision_dim=32, vision_layers=1,
                      vision_heads=2, hidden_size=64, num_layers=2, num_heads=4,
                      intermediate_size=128, max_instruction_bytes=40,
                      max_position_embeddings=160)


def scenes(count: int, seed: int) -> list:
    return list(SyntheticScenes(count, seed=seed, height_px=48, width_px=64))


def scripted_action(obs) -> np.ndarray:
    """A deterministic physical action from the scene: move towards the named block."""
    u, v = obs.extras["goal_uv"]
    pick = obs.instruction.startswith("pick")
    return np.array([(u - 0.5) * 0.04, (v - 0.5) * 0.04, -0.01 if pick else 0.01,
                     0.1 * (u - v), 0.05, -0.05 if pick else 0.05, 1.0 if pick else 0.0])


def train_tiny_vla(vla: SmallVLA, observations, steps: int, batch: int = 8,
                   seed: int = 0) -> SmallVLA:
    """Teacher-forced cross-entropy on the 7 scripted action tokens of each observation.

    Batches are right-padded; a 2-D attention mask hides the padding.
    """
    codec = ActionCodec()
    data = [(obs, torch.as_tensor(vla.actions.token_of_bin(codec.encode(scripted_action(obs)))))
            for obs in observations]
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(vla.net.parameters(), lr=3e-3)
    vla.net.train()
    for step in range(steps):
        items = [data[(batch * step + k) % len(data)] for k in range(batch)]
        seqs = [torch.cat([vla.prefix(obs).embeds[0], vla.embed(tokens)[0]])
                for obs, tokens in items]
        length = max(len(x) for x in seqs)
        embeds = torch.stack([F.pad(x, (0, 0, 0, length - len(x))) for x in seqs])
        mask = torch.stack([torch.arange(length) < len(x) for x in seqs]).long()
        logits = vla.language_model(inputs_embeds=embeds, attention_mask=mask).logits
        rows = torch.stack([torch.arange(len(x) - 8, len(x) - 1) for x in seqs])  # predict the 7
        picked = logits[torch.arange(batch)[:, None], rows]
        loss = F.cross_entropy(picked.reshape(-1, picked.shape[-1]),
                               torch.stack([t for _, t in items]).reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    vla.net.eval()
    return vla


def train_drafter(vla: SmallVLA, observations, steps: int, seed: int = 0) -> DraftHead:
    config = DrafterTrainConfig(steps=steps, batch_size=8, lr=3e-3, seed=seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        head = DraftHead(DraftHeadConfig.for_target(vla))
    trainer = DrafterTrainer(vla, head, config, collect_rollouts(vla, observations))
    while trainer.step < steps:
        trainer.train_step()
    return head.eval()
