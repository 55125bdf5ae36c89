r"""heisd-train-vla: behaviour-clone the small VLA on the simulator's npz demonstrations.

Teacher forcing of the 7 action tokens, cross-entropy over the 256 action logits (see
``heisd_ros.training.vla_training``), AdamW with warmup + cosine decay, seed-fixed and
resumable; then a closed-loop AR evaluation on held-out seeds of every suite.

Examples:
    heisd-collect --suites piper_spatial piper_object piper_goal piper_long --episodes 25 \
        --seed 1000 --out data/demos_128 --format npz --image-size 128
    heisd-train-vla --demos data/demos_128 --out runs/vla --steps 3000 --threads 2
    heisd-train-vla --demos data/demos_128 --out runs/vla --steps 3000 --resume
    # a subgoal pathway (as the shipped model's): a second, instruction-conditioned encoder
    # first learns where the hand goes next (half the draws from piper_object's steps before
    # the first grasp, half from every step), then only its embedding trains on the actions,
    # steering the trained decoder, which stays as it was (so do both encoders)
    heisd-train-vla --demos data/demos_128 --out runs/vla_path \
        --init-from runs/vla/small_vla.safetensors --subgoal-pathway 64 \
        --pathway-steps 3000 --pretrain-suites piper_object --pretrain-before-grasp \
        --pretrain-focus-share 0.5 --train-only subgoal.embed. --lr 1e-4 \
        --pathway-lr-factor 30
    # only (re-)evaluate OUT/small_vla.safetensors closed loop and update the card
    heisd-train-vla --demos data/demos_128 --out runs/vla --eval-only \
        --eval-episodes 5

Writes ``OUT/small_vla.safetensors`` (fp16, with the action statistics in its metadata;
also refreshed at every validation), ``OUT/card.json`` and ``OUT/train_state.pt``. The
resized images are cached in ``OUT/demo_cache_<S>.npz`` (or ``--cache``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from heisd_ros.tools._common import set_threads

DEFAULT_SUITES = ("piper_spatial", "piper_object", "piper_goal", "piper_long")


def load_or_build_cache(demos, cache_path: Path, image_size_px: int, show_progress: bool):
    """The demo cache at ``cache_path``, built from ``demos`` if missing or for another size."""
    from tqdm import tqdm

    from heisd_ros.data.npz_episodes import iter_episode_paths
    from heisd_ros.training.demo_cache import DemoCache, build_demo_cache

    if cache_path.is_file():
        cache = DemoCache.load(cache_path)
        if cache.image_size_px == image_size_px and cache.source == str(demos):
            return cache
    with tqdm(total=len(iter_episode_paths(demos)), desc="cache", unit="episode",
              disable=not show_progress) as bar:
        cache = build_demo_cache(demos, image_size_px, progress=bar.update)
    cache.save(cache_path)
    return cache


def save_model(vla, path: Path, stats) -> None:
    """fp16 safetensors with the action statistics in the metadata (``action_stats``)."""
    from heisd_ros.models.checkpoint import save_small_vla

    save_small_vla(vla, path, dtype="float16", extra={"action_stats": stats.to_json()})


def merge_closed_loop(out: Path, run: dict, suites: list[str]) -> dict:
    """Store one evaluation run per suite in ``OUT/closed_loop/`` and merge all into the card.

    Suites may be evaluated by separate (parallel) invocations; the card's ``closed_loop_ar``
    holds the latest run of every suite and the mean over the suites present.
    """
    folder = out / "closed_loop"
    folder.mkdir(exist_ok=True)
    settings = {k: v for k, v in run.items() if k not in suites and k != "mean_over_suites"}
    for suite in suites:
        (folder / f"{suite}.json").write_text(
            json.dumps({**settings, **run[suite]}, indent=2) + "\n")
    merged = {path.stem: json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))}
    card_path = out / "card.json"
    card = json.loads(card_path.read_text()) if card_path.is_file() else {}
    card["closed_loop_ar"] = {
        **merged, "mean_over_suites": sum(v["success_rate"] for v in merged.values())
        / len(merged)}
    card_path.write_text(json.dumps(card, indent=2) + "\n")
    return card


def train(args) -> dict:
    """Run training (and the closed-loop evaluation) as the command line asks; returns the card."""
    import numpy as np
    import torch
    from tqdm import tqdm

    from heisd_ros.actions.normalization import ActionStats
    from heisd_ros.models.checkpoint import load_small_vla
    from heisd_ros.models.small_vla import SmallVLA
    from heisd_ros.models.small_vla_config import SmallVLAConfig
    from heisd_ros.training.demo_cache import split_episodes
    from heisd_ros.training.vla_training import (
        Anchor,
        VLATrainConfig,
        VLATrainer,
        closed_loop_success,
    )

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    state_path, model_path, card_path = (out / "train_state.pt", out / "small_vla.safetensors",
                                         out / "card.json")
    # A fine-tuned model keeps the config of the model it starts from (read below).
    model_config = None if args.init_from else SmallVLAConfig(
        num_layers=args.layers, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_heads=args.heads, vision_dim=args.vision_dim, vision_layers=args.vision_layers,
        image_size_px=args.image_size, patch_size_px=args.patch_size,
        stem_channels=args.stem_channels, subgoal_pathway=args.subgoal_pathway,
        proprio_dim=7 if args.proprio else 0, proprio_features="pose" if args.proprio else "raw")
    card = json.loads(card_path.read_text()) if card_path.is_file() else {}
    command = "heisd-train-vla " + " ".join(shlex.quote(a) for a in args.argv)
    card.setdefault("commands", []).append(command)
    card_path.write_text(json.dumps(card, indent=2) + "\n")

    if not args.eval_only:
        if args.resume and not state_path.is_file():
            raise FileNotFoundError(f"--resume: no checkpoint at {state_path}")
        init = load_small_vla(args.init_from) if args.init_from else None
        if init is not None:
            if init.action_stats is None:
                raise ValueError(f"--init-from: {args.init_from} has no action statistics")
            if args.subgoal_pathway and init.config.subgoal_pathway != args.subgoal_pathway:
                # Adds the pathway (its embedding zero at first) to a model trained without it.
                init = init.with_subgoal_pathway(args.subgoal_pathway, args.seed)
            model_config = init.config
        cache_path = Path(args.cache) if args.cache else out / \
            f"demo_cache_{model_config.image_size_px}.npz"
        cache = load_or_build_cache(args.demos, cache_path, model_config.image_size_px,
                                    not args.quiet)
        train_index, val_index = split_episodes(cache, args.heldout_per_task)
        train_episodes = sorted(set(cache.episode[train_index].tolist()))
        # Fine-tuning keeps the bins of the model it starts from unless told otherwise.
        if init is not None and not args.new_action_stats:
            stats = init.action_stats
        else:
            stats = ActionStats.from_actions(cache.actions[train_index], args.action_quantile)
        config = VLATrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                                warmup_steps=args.warmup, shift_px=args.shift_px, seed=args.seed,
                                label_sigma_bins=args.label_sigma_bins,
                                aux_weight=args.aux_weight,
                                freeze_vision=args.freeze_vision,
                                train_only=tuple(args.train_only),
                                pathway_lr_factor=args.pathway_lr_factor,
                                gripper_change_weight=args.gripper_change_weight,
                                anchor_weight=args.anchor_weight if args.anchor_to else 0.0)
        if init is not None:
            vla = init
        else:
            with torch.random.fork_rng():
                torch.manual_seed(args.seed)
                vla = SmallVLA.random(model_config, seed=args.seed)
        # Training uses PyTorch's fused attention; the checkpoint keeps the config's
        # (mask-capable) implementation for the decoders.
        vla.net.llm.set_attn_implementation("sdpa")
        anchor = None
        if args.anchor_to:
            suites = args.anchor_suites or sorted(set(cache.episode_suites.tolist()))
            anchor = Anchor(load_small_vla(args.anchor_to), tuple(suites))
            anchor.teacher.net.llm.set_attn_implementation("sdpa")
        trainer = VLATrainer(vla, cache, train_index, config, stats, anchor)
        if args.resume:
            trainer.load_state_dict(torch.load(state_path, weights_only=False))
        rng = np.random.default_rng(args.seed + 1)
        val_subset = np.sort(rng.choice(val_index, size=min(args.val_samples, len(val_index)),
                                        replace=False))
        history = card.get("validation", []) if args.resume else []
        if args.pretrain_vision_steps and not args.resume:
            card["vision_pretraining"] = run_vision_pretraining(trainer, args, val_subset)
            card_path.write_text(json.dumps(card, indent=2) + "\n")
        if args.pathway_steps and not args.resume:
            card["subgoal_pathway_stage"] = run_pathway_stage(trainer, args, val_subset)
            card_path.write_text(json.dumps(card, indent=2) + "\n")
        started = time.perf_counter()
        with tqdm(total=config.steps, initial=trainer.step, desc="train", unit="step",
                  disable=args.quiet) as bar:
            while trainer.step < config.steps:
                metrics = trainer.train_step()
                bar.update(1)
                bar.set_postfix(loss=f"{metrics['loss']:.3f}", acc=f"{metrics['acc']:.2f}",
                                lr=f"{metrics['lr']:.1e}",
                                **({"kl": f"{metrics['anchor_kl']:.3f}"}
                                   if "anchor_kl" in metrics else {}))
                last = trainer.step == config.steps
                if trainer.step % args.val_every == 0 or last:
                    val = trainer.evaluate(val_subset)
                    history.append({"step": trainer.step, "train_loss": metrics["loss"], **val})
                    tqdm.write(json.dumps(history[-1]))
                    save_model(vla, model_path, stats)
                    # The card so far, so an interrupted run keeps its commands and history.
                    card["validation"] = history
                    card_path.write_text(json.dumps(card, indent=2) + "\n")
                if trainer.step % args.checkpoint_every == 0 or last:
                    torch.save(trainer.state_dict(), state_path)
        if not history or history[-1]["step"] != trainer.step:
            # e.g. a run resumed with --steps equal to the steps already done.
            history.append({"step": trainer.step, "train_loss": trainer.last_loss,
                            **trainer.evaluate(val_subset)})
        card.update({
            "model": json.loads(model_config.to_json()),
            "parameters": sum(p.numel() for p in vla.net.parameters()),
            "data": {"demos": str(args.demos), "episodes": len(cache.episode_names),
                     "steps": int(len(cache.actions)), "train_episodes": len(train_episodes),
                     "train_steps": int(len(train_index)),
                     "validation_episodes": len(cache.episode_names) - len(train_episodes),
                     "validation_steps": int(len(val_index)),
                     "heldout": f"last {args.heldout_per_task} seed(s) of every task"},
            "training": {**config.to_dict(), "steps_done": trainer.step,
                         "threads": args.threads,
                         "wall_time_s_this_run": round(time.perf_counter() - started, 1)},
            "action_stats": json.loads(stats.to_json()),
            "validation": history,
            "final_validation": history[-1] if history else None})
        save_model(vla, model_path, stats)
        card_path.write_text(json.dumps(card, indent=2) + "\n")

    if args.eval_episodes > 0:
        vla = load_small_vla(model_path)
        started = time.perf_counter()
        with tqdm(desc="closed loop", unit="task", disable=args.quiet) as bar:
            results = closed_loop_success(
                vla, vla.codec, args.suites, args.eval_episodes, args.eval_seed,
                args.eval_image_size, args.eval_max_steps,
                progress=lambda task, k: (bar.update(1), bar.set_postfix(task=task, ok=k)))
        run = {"seed": args.eval_seed, "episodes_per_task": args.eval_episodes,
               "image_size_px": args.eval_image_size,
               "max_steps": args.eval_max_steps or "task default",
               "wall_time_s": round(time.perf_counter() - started, 1), **results}
        card = merge_closed_loop(out, run, args.suites)
    return card


def pretraining_steps(trainer, suites: list[str] | None, before_grasp: bool,
                      focus_share: float = 1.0):
    """The training steps the vision pretraining stage draws from (see the options).

    ``suites`` and ``before_grasp`` select the focus steps. With ``focus_share`` < 1 the pool
    holds every training step once plus the focus steps repeated, so that a uniform draw from
    it is a focus step with about that probability (the encoder keeps seeing the whole task
    while it learns the focus).
    """
    import numpy as np

    from heisd_ros.training.subgoal import before_first_grasp

    cache, index = trainer.cache, trainer.train_index
    keep = np.ones(len(index), bool)
    if suites:
        known = sorted(set(cache.episode_suites.tolist()))
        unknown = sorted(set(suites) - set(known))
        if unknown:
            raise ValueError(f"--pretrain-suites: {unknown} not in the demonstrations; they "
                             f"hold {known}")
        keep &= np.isin(cache.episode_suites, list(suites))[cache.episode[index]]
    if before_grasp:
        keep &= before_first_grasp(cache.actions[:, -1], cache.episode)[index]
    focus = index[keep]
    if not 0 < focus_share <= 1:
        raise ValueError(f"--pretrain-focus-share: expected a share in (0, 1], got {focus_share}")
    if focus_share == 1 or len(focus) == 0 or len(focus) == len(index):
        return focus
    # k repeats of the focus steps among all len(index) steps: share = k f / (n + k f).
    repeats = max(0, round(focus_share * len(index) / ((1 - focus_share) * len(focus))) - 1)
    return np.concatenate([index, np.tile(focus, repeats)])


def run_vision_pretraining(trainer, args, val_subset) -> dict:
    """Stage 1 (``--pretrain-vision-steps``): the auxiliary objective alone; returns its record."""
    from heisd_ros.training.vision_pretraining import pretrain_vision

    return _run_stage(trainer, args, val_subset, pretrain_vision, args.pretrain_vision_steps,
                      "vision", "aux_loss")


def run_pathway_stage(trainer, args, val_subset) -> dict:
    """``--pathway-steps``: the subgoal pathway's predictor alone; returns its record."""
    from heisd_ros.training.subgoal import pretrain_subgoal_pathway

    if trainer.vla.net.subgoal is None:
        raise ValueError("--pathway-steps: the model has no subgoal pathway; add one with "
                         "--subgoal-pathway WIDTH")
    return _run_stage(trainer, args, val_subset, pretrain_subgoal_pathway, args.pathway_steps,
                      "subgoal pathway", "pathway_loss")


def _run_stage(trainer, args, val_subset, train, steps: int, desc: str, loss_key: str) -> dict:
    """Run ``train(trainer, steps, batch, lr, progress, index)`` on the ``--pretrain-*`` pool.

    Returns its record: validation ``loss_key`` before and after, the last training losses
    and the wall time.
    """
    from tqdm import tqdm

    pool = pretraining_steps(trainer, args.pretrain_suites, args.pretrain_before_grasp,
                             args.pretrain_focus_share)
    before = trainer.evaluate(val_subset)[loss_key]
    started = time.perf_counter()
    with tqdm(total=steps, desc=desc, unit="step", disable=args.quiet) as bar:
        losses = train(trainer, steps, args.pretrain_batch_size, args.pretrain_lr,
                       progress=lambda loss: (bar.update(1), bar.set_postfix(loss=f"{loss:.4f}")),
                       index=pool)
    record = {"steps": steps, "batch_size": args.pretrain_batch_size,
              "lr": args.pretrain_lr, "suites": args.pretrain_suites or "all",
              "before_grasp_only": args.pretrain_before_grasp, "pool_steps": int(len(pool)),
              "focus_share": args.pretrain_focus_share,
              f"val_{loss_key}_before": before,
              f"val_{loss_key}_after": trainer.evaluate(val_subset)[loss_key],
              f"train_{loss_key}_last_50": sum(losses[-50:]) / len(losses[-50:]),
              "wall_time_s": round(time.perf_counter() - started, 1)}
    tqdm.write(json.dumps(record))
    return record


def parse_args(argv=None) -> argparse.Namespace:
    """Command line of ``heisd-train-vla``."""
    from heisd_ros.models.small_vla_config import SmallVLAConfig

    d = SmallVLAConfig()
    parser = argparse.ArgumentParser(prog="heisd-train-vla", description=__doc__.split("\n")[0])
    parser.add_argument("--demos", required=True, help="npz demonstrations (heisd-collect)")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--cache", default=None, help="resized-image cache (.npz)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")

    group = parser.add_argument_group("optimisation")
    group.add_argument("--steps", type=int, default=3000)
    group.add_argument("--batch-size", type=int, default=32)
    group.add_argument("--lr", type=float, default=1e-3)
    group.add_argument("--warmup", type=int, default=100, help="warmup steps")
    group.add_argument("--shift-px", type=int, default=2, help="random image shift (augment)")
    group.add_argument("--seed", type=int, default=0)
    group.add_argument("--label-sigma-bins", type=float, default=0.0,
                       help="Gaussian soft labels of this width (bins) for the continuous "
                            "dimensions; 0 = one-hot cross-entropy")
    group.add_argument("--gripper-change-weight", type=float, default=1.0,
                       help="sampling weight of the steps around a gripper change (1 = "
                            "uniform; see VLATrainConfig)")
    group.add_argument("--aux-weight", type=float, default=0.0,
                       help="weight of the auxiliary vision objective next to the action "
                            "tokens (future EE displacement etc.); 0 = none")

    group = parser.add_argument_group("a new model's architecture (ignored with --init-from)")
    group.add_argument("--layers", type=int, default=d.num_layers)
    group.add_argument("--hidden", type=int, default=d.hidden_size)
    group.add_argument("--intermediate", type=int, default=d.intermediate_size)
    group.add_argument("--heads", type=int, default=d.num_heads)
    group.add_argument("--vision-dim", type=int, default=d.vision_dim)
    group.add_argument("--vision-layers", type=int, default=d.vision_layers)
    group.add_argument("--image-size", type=int, default=d.image_size_px,
                       help="camera images are resized to this many pixels square")
    group.add_argument("--patch-size", type=int, default=d.patch_size_px,
                       help="pixels per vision token side")
    group.add_argument("--stem-channels", type=int, default=d.stem_channels,
                       help="0 = linear patch embedding; > 0 = convolutional stem width")
    group.add_argument("--proprio", action="store_true",
                       help="feed the EE pose + gripper width as one token (sin/cos angles)")

    group = parser.add_argument_group("fine-tuning and resuming")
    group.add_argument("--init-from", default=None, metavar="SAFETENSORS",
                       help="fine-tune: start from this small VLA's weights, architecture and "
                            "action bins (a new optimiser and schedule)")
    group.add_argument("--resume", action="store_true", help="continue from OUT/train_state.pt")
    group.add_argument("--new-action-stats", action="store_true",
                       help="with --init-from: compute the bins from this data with "
                            "--action-quantile instead of keeping the model's")
    group.add_argument("--action-quantile", type=float, default=None,
                       help="action bins span the [q, 1 - q] quantiles of the training "
                            "actions per dimension (default 0.01, as OpenVLA); smaller keeps "
                            "the clipped edge bins rare (see ActionStats.from_actions)")
    group.add_argument("--freeze-vision", action="store_true",
                       help="keep the main vision encoder as the starting model has it; "
                            "train the projector and the decoder")
    group.add_argument("--anchor-to", default=None, metavar="SAFETENSORS",
                       help="keep the model close to this fixed one (usually --init-from's) on "
                            "the steps of --anchor-suites: --anchor-weight x the KL divergence "
                            "from its action distributions joins the loss (learning without "
                            "forgetting); needs its action bins")
    group.add_argument("--anchor-weight", type=float, default=1.0,
                       help="weight of the anchor's KL term (with --anchor-to)")
    group.add_argument("--anchor-suites", nargs="+", default=None, metavar="SUITE",
                       help="the suites whose steps are anchored (default: every suite in "
                            "the data)")
    group.add_argument("--train-only", nargs="+", default=[], metavar="PREFIX",
                       help="train only the parameters whose names start with a PREFIX, "
                            "e.g. subgoal.embed. (a subgoal pathway's embedding; every other "
                            "weight as the starting model has it)")

    group = parser.add_argument_group(
        "stages before the action loss (each trains its part alone on its own targets)")
    group.add_argument("--pretrain-vision-steps", type=int, default=0,
                       help="the vision encoder on the auxiliary objective (needs "
                            "--aux-weight > 0)")
    group.add_argument("--subgoal-pathway", type=int, default=d.subgoal_pathway,
                       metavar="WIDTH",
                       help="a second, instruction-conditioned (FiLM of this width) encoder "
                            "that predicts where the hand is at the next two gripper changes "
                            "and feeds that to the decoder at the last prompt token; 0 = "
                            "none. With --init-from a model without it, it is added (the "
                            "decoder's input unchanged until trained). Needs --proprio and a "
                            "stem")
    group.add_argument("--pathway-steps", type=int, default=0,
                       help="the subgoal pathway's encoder and head on its targets; the action "
                            "loss never trains them")
    group.add_argument("--pathway-lr-factor", type=float, default=1.0,
                       help="learning rate of the subgoal pathway's embedding relative to "
                            "--lr (it starts at zero; a fine-tune's small rate keeps it too "
                            "small for the decoder to read)")
    group.add_argument("--pretrain-batch-size", type=int, default=64)
    group.add_argument("--pretrain-lr", type=float, default=1e-3)
    group.add_argument("--pretrain-suites", nargs="+", default=None, metavar="SUITE",
                       help="the stages draw only from these suites' episodes (e.g. "
                            "piper_object, where the instruction names the object)")
    group.add_argument("--pretrain-before-grasp", action="store_true",
                       help="the stages draw only from the steps before each episode's first "
                            "grasp (where the subgoal is the named object)")
    group.add_argument("--pretrain-focus-share", type=float, default=1.0,
                       help="with --pretrain-suites / --pretrain-before-grasp: the share of "
                            "the draws that come from those steps; the rest come from every "
                            "training step (default 1: only those steps)")

    group = parser.add_argument_group("validation and checkpoints")
    group.add_argument("--heldout-per-task", type=int, default=1,
                       help="validation episodes per task (the last seeds)")
    group.add_argument("--val-every", type=int, default=250)
    group.add_argument("--val-samples", type=int, default=512)
    group.add_argument("--checkpoint-every", type=int, default=50)

    group = parser.add_argument_group("closed-loop evaluation (after training)")
    group.add_argument("--eval-only", action="store_true",
                       help="skip training; evaluate OUT/small_vla.safetensors")
    group.add_argument("--eval-episodes", type=int, default=5,
                       help="closed-loop episodes per task (0 = skip)")
    group.add_argument("--eval-seed", type=int, default=0,
                       help="first closed-loop seed; keep it outside the demos' seeds (the "
                            "documented datasets use 1000 and up; heisd-eval starts at 0 too)")
    group.add_argument("--eval-image-size", type=int, default=128,
                       help="simulator camera size (the demos' size)")
    group.add_argument("--eval-max-steps", type=int, default=None)
    group.add_argument("--suites", nargs="+", default=list(DEFAULT_SUITES))
    args = parser.parse_args(argv)
    if args.new_action_stats and not args.init_from:
        parser.error("--new-action-stats: only with --init-from (a new model always computes "
                     "its bins from the data)")
    if args.action_quantile is None:
        from heisd_ros.actions.normalization import OPENVLA_QUANTILE

        args.action_quantile = OPENVLA_QUANTILE
    elif args.init_from and not args.new_action_stats:
        parser.error("--action-quantile: with --init-from the model's bins are kept; add "
                     "--new-action-stats to compute new ones")
    if not 0.0 <= args.action_quantile < 0.5:
        parser.error(f"--action-quantile: expected [0, 0.5), got {args.action_quantile}")
    if args.anchor_to and not args.anchor_weight > 0:
        parser.error(f"--anchor-weight: expected > 0 with --anchor-to, got {args.anchor_weight}")
    if args.anchor_suites and not args.anchor_to:
        parser.error("--anchor-suites: only with --anchor-to (the model to stay close to)")
    if args.train_only and args.freeze_vision:
        parser.error("--train-only: not with --freeze-vision (name what trains instead)")
    if args.pretrain_vision_steps and not args.aux_weight > 0:
        parser.error("--pretrain-vision-steps: needs --aux-weight > 0 (the stage trains the "
                     "objective's head, which the joint training keeps using)")
    if args.freeze_vision and args.aux_weight > 0:
        parser.error("--freeze-vision: not with --aux-weight (its objective would train "
                     "nothing but its head)")
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def main(argv=None) -> int:
    """Entry point of ``heisd-train-vla``."""
    args = parse_args(argv)
    set_threads(args.threads)
    card = train(args)
    print(json.dumps({"out": args.out, "final_validation": card.get("final_validation"),
                      "closed_loop_ar": {k: v if k == "mean_over_suites" else
                                         v.get("success_rate") if isinstance(v, dict) else v
                                         for k, v in card.get("closed_loop_ar", {}).items()}},
                     indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
