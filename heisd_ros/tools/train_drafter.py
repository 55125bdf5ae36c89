"""heisd-train-drafter: train the EAGLE-style draft head by self-distillation.

The target greedily decodes each observation; the head learns to predict the target's
hidden states and action distributions (see ``heisd_ros.training.draft_training``).

Examples:
    # synthetic scenes, random-init (or shipped) target, 600 steps
    heisd-train-drafter --out runs/drafter
    # a trained target, more data; continue an interrupted run
    heisd-train-drafter --target small_vla.safetensors --observations 1024 --out runs/dr
    heisd-train-drafter --target small_vla.safetensors --observations 1024 --out runs/dr --resume
    # observations from the simulator's npz demonstrations (heisd-collect --format npz)
    heisd-train-drafter --demos data/demos_128 --observations 512 --out runs/dr
    # an OpenVLA checkpoint, observations from recorded bags (heisd-record, ros2 bag record)
    heisd-train-drafter --model openvla --checkpoint ckpt/openvla-7b-ft --unnorm-key KEY \
        --demos runs/bags --observations 4096 --out runs/drafter_openvla

Writes ``OUT/draft_head.safetensors``, ``OUT/card.json`` (data, steps, loss, held-out
acceptance) and ``OUT/train_state.pt`` (checkpoint for ``--resume``). The library function
:func:`train` accepts any iterable of ``Observation`` (e.g. the simulator's demonstrations).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from heisd_ros.tools._common import add_model_arguments, load_target_from_args, set_threads


def train(target, target_description: str, observations, heldout, out_dir, config,
          checkpoint_every: int = 100, resume: bool = False, data_description: str = "",
          tree_config=None, show_progress: bool = True) -> dict:
    """Train a draft head for ``target`` on ``observations`` and write it to ``out_dir``.

    ``observations`` and ``heldout`` are any iterables of ``Observation``; returns the card.
    ``target_description`` is the card's ``target``: the file name and sha256 prefix of a
    small-VLA file (``draft_head_choice.card_target``), which the draft-head check reads and
    messages show, so no path of the training machine.
    """
    import torch
    from tqdm import tqdm

    from heisd_ros.models.checkpoint import save_draft_head
    from heisd_ros.models.draft_head import DraftHead, DraftHeadConfig
    from heisd_ros.training.draft_training import (
        DrafterTrainer,
        collect_rollouts,
        heldout_acceptance,
    )

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    state_path = out_dir / "train_state.pt"
    if resume and not state_path.is_file():
        raise FileNotFoundError(f"--resume: no checkpoint at {state_path}")
    with tqdm(desc="rollouts", unit="obs", disable=not show_progress) as bar:
        rollouts = collect_rollouts(target, observations, progress=lambda n: bar.update(1))
    with torch.random.fork_rng():
        torch.manual_seed(config.seed)
        head = DraftHead(DraftHeadConfig.for_target(target)).to(target.device)
    trainer = DrafterTrainer(target, head, config, rollouts)
    if resume:
        trainer.load_state_dict(torch.load(state_path, weights_only=False))
    with tqdm(total=config.steps, initial=trainer.step, desc="train", unit="step",
              disable=not show_progress) as bar:
        while trainer.step < config.steps:
            metrics = trainer.train_step()
            bar.update(1)
            bar.set_postfix(loss=f"{metrics['loss']:.3f}", top1=f"{metrics['top1']:.2f}")
            if trainer.step % checkpoint_every == 0 or trainer.step == config.steps:
                torch.save(trainer.state_dict(), state_path)
    acceptance = heldout_acceptance(target, head, heldout, tree_config)
    from heisd_ros.retrieval.embedding import model_fingerprint

    # The fingerprint names the target's weights; a metadata-only change of the target file
    # (e.g. its gripper rule) changes the file's sha256 but not the network the head fits.
    card = {"target": target_description, "target_fingerprint": model_fingerprint(target),
            "data": data_description,
            "train_rollouts": len(rollouts), "steps": trainer.step,
            "final_loss": trainer.last_loss, "config": config.to_dict(),
            "heldout": acceptance, "head_config": json.loads(head.config.to_json())}
    save_draft_head(head, out_dir / "draft_head.safetensors", target,
                    extra={"card": json.dumps(card)})
    (out_dir / "card.json").write_text(json.dumps(card, indent=2) + "\n")
    return card


def _demo_episodes(root) -> dict:
    """Task -> sorted episodes under ``root``: npz files (heisd-collect), else rosbag2 bags.

    Bags are read as ``heisd-build-db`` reads them with its default topics; their task comes
    from the custom data ``heisd-record`` and ``heisd-collect --format mcap`` write.
    """
    from heisd_ros.data import bag_episodes
    from heisd_ros.data.npz_episodes import iter_episode_paths

    by_task: dict = {}
    root = Path(root)
    npz = [] if bag_episodes.is_bag(root) else iter_episode_paths(root)
    if npz:
        for path in npz:
            by_task.setdefault(path.parent, []).append(path)
    else:
        for path in bag_episodes.find_bags(root):
            by_task.setdefault(bag_episodes.bag_identity(path)["task"], []).append(path)
    return {task: sorted(paths) for task, paths in by_task.items()}


def demo_observations(root, n: int, heldout: bool, seed: int) -> list:
    """``n`` observations spread over the demonstrations under ``root`` (npz or rosbag2).

    The last episode of every task is the held-out episode (``heldout=True`` draws from
    those only, else from the rest), as in ``heisd-train-vla``'s validation split.
    """
    import numpy as np

    from heisd_ros.data.bag_episodes import load_any_episode
    from heisd_ros.data.npz_episodes import iter_steps

    by_task = _demo_episodes(root)
    paths = [p for group in by_task.values() for p in (group[-1:] if heldout else group[:-1])]
    if not paths:
        raise ValueError(f"--demos: no {'held-out ' if heldout else 'training '}episodes under "
                         f"{root} (npz demonstrations or rosbag2 recordings; the last episode "
                         f"of every task is held out, so a task needs two)")
    rng = np.random.default_rng(seed)
    per_episode = np.bincount(rng.integers(0, len(paths), size=n), minlength=len(paths))
    picked = []
    for path, k in zip(paths, per_episode, strict=True):
        if k:
            steps = [obs for obs, _ in iter_steps(load_any_episode(path))]
            picked += [steps[i] for i in sorted(rng.choice(len(steps), size=min(k, len(steps)),
                                                           replace=False))]
    return picked


def parse_args(argv=None) -> argparse.Namespace:
    """Command line of ``heisd-train-drafter``."""
    parser = argparse.ArgumentParser(prog="heisd-train-drafter", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--target", default=None, help="small-VLA safetensors (default: shipped "
                        "weights if present, else a seeded random init)")
    add_model_arguments(parser)
    parser.add_argument("--observations", type=int, default=256, help="training observations")
    parser.add_argument("--demos", default=None, help="demonstrations to draw observations "
                        "from: an npz root (heisd-collect) or rosbag2 recordings (a bag, or a "
                        "root holding bags, e.g. heisd-record's; default: synthetic scenes)")
    parser.add_argument("--heldout", type=int, default=32, help="held-out observations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument("--resume", action="store_true", help="continue from OUT/train_state.pt")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    return parser.parse_args(argv)


def run(args) -> dict:
    """Train the draft head as ``args`` say; returns the card."""
    from heisd_ros.models.synthetic_scenes import SyntheticScenes
    from heisd_ros.training.draft_training import DrafterTrainConfig

    config = DrafterTrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                                seed=args.seed)
    from heisd_ros.models.draft_head_choice import card_target
    from heisd_ros.models.loading import TargetChoice

    target, description = load_target_from_args(args)
    # By file name and sha256, not the path given here (e.g. a run folder of this machine).
    description = card_target(TargetChoice.from_args(args).small_vla_file(), description)
    if args.demos:
        data = demo_observations(args.demos, args.observations, False, args.seed)
        heldout = demo_observations(args.demos, args.heldout, True, args.seed + 1)
        described = (f"{len(data)} steps of the demos {args.demos} (held out: {len(heldout)} "
                     f"steps of the last episode of every task; seed={args.seed})")
    else:
        data = SyntheticScenes(args.observations, seed=args.seed)
        heldout = SyntheticScenes(args.heldout, seed=args.seed + 1_000_003)
        described = data.describe()
    return train(target, description, data, heldout, args.out, config, args.checkpoint_every,
                 args.resume, described)


def main(argv=None) -> int:
    """Entry point of ``heisd-train-drafter``."""
    args = parse_args(argv)
    set_threads(args.threads)
    card = run(args)
    print(json.dumps({"out": args.out, "steps": card["steps"], "final_loss": card["final_loss"],
                      "heldout": card["heldout"]}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
