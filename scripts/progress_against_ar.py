r"""How far each executed action goes where the target's own greedy action would have gone.

A hybrid method executes actions that are not the target's greedy ones: retrieved actions
run unverified (checked behind), and retrieval drafts accepted by the relaxed sequence-wise
rule. This script runs a method in lockstep and, at every step, also decodes the target's AR
action on the very observation the method decided on (same episode state, so the same
gripper rule). Per kind of step it reports how often the executed action is the AR one, the
distance between their translations, and the progress along AR's direction as a share of
AR's length (1 = as far as AR would have gone; an episode that gets 0.87 of AR's progress
per step needs about 1 / 0.87 as many steps).

    python scripts/progress_against_ar.py --db DB --calibration DB/calibration.json \\
        --skip-threshold 0.98 --method heisd_behind --episodes 2 --seed 100 --out steps.jsonl

Every step goes to ``--out`` as one JSON line (kind, executed and AR actions); the table is
printed as Markdown. ``--accept-token-max-bins`` / ``--accept-group-sum-max-bins`` change
the relaxed rule's tolerances as heisd-eval's options do. It decodes twice per step: about
twice a lockstep evaluation's time.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np

STATIC_SUITES = ("piper_spatial", "piper_object", "piper_goal", "piper_long")
#: Step kinds by (verified?, draft source).
KIND_NAMES = {
    (False, "retrieval"): "retrieved, not verified (checked behind)",
    (True, "retrieval"): "retrieval draft, relaxed verification",
    (True, "ar+retrieval"): "router AR mode (retrieval tree)",
    (True, ""): "AR (no draft)",
    (True, "drafter+retrieval"): "draft head + retrieval",
    (True, "drafter"): "draft head",
}


def run(args) -> list[dict]:
    """Lockstep episodes of ``args.method``; one row per step with the AR action beside."""
    from tqdm import tqdm

    from heisd_ros.decoder_loader import CLI_NAMES, DecoderOptions
    from heisd_ros.eval.methods import DecoderPolicy, build_method, make_context
    from heisd_ros.sim.config import SimConfig
    from heisd_ros.sim.runner import run_episodes
    from heisd_ros.sim.suites import list_tasks

    options = DecoderOptions(db_dir=args.db, calibration_path=args.calibration or "",
                             skip_threshold=args.skip_threshold,
                             accept_token_max_bins=args.accept_token_max_bins,
                             accept_group_sum_max_bins=args.accept_group_sum_max_bins,
                             names=CLI_NAMES)
    ctx, _ = make_context([args.method, "ar"], options, target_path=args.target)
    config = SimConfig(image_width_px=args.image_size, image_height_px=args.image_size)
    rows: list[dict] = []
    tasks = [(s, t) for s in args.suites for t in list_tasks(s)]
    try:
        for suite, task in tqdm(tasks, desc="tasks", unit="task"):
            ctx.use_suite(suite)
            policy = DecoderPolicy(build_method(args.method, ctx), task)
            reference = build_method("ar", ctx)

            class Paired:
                """The method's policy, with the AR action decoded first on each observation."""

                def reset(self, policy=policy, reference=reference, task=task) -> None:
                    policy.finish_checks()
                    policy.reset()
                    reference.begin_episode(task)

                def __call__(self, obs, policy=policy, reference=reference, suite=suite,
                             task=task):
                    ar = reference.decode(replace(obs, episode=policy.episode)).action
                    action, step = policy.act(obs)
                    rows.append({"suite": suite, "task": task,
                                 "verified": not step["verify_skipped"],
                                 "draft_source": step["draft_source"],
                                 "target_forwards": step["target_forwards"],
                                 "action": np.asarray(action, float).tolist(),
                                 "ar": np.asarray(ar, float).tolist()})
                    return action, step

            result = run_episodes(Paired(), suite, task, args.episodes, args.seed, config=config)
            rows.append({"suite": suite, "task": task, "successes": result.successes,
                         "steps": [e.steps for e in result.episodes]})
    finally:
        ctx.close()
    return rows


def progress_table(rows: list[dict]) -> str:
    """The Markdown table of the step rows (episode rows are skipped)."""
    steps = [r for r in rows if "action" in r]
    if not steps:
        raise ValueError("no steps to summarise")
    groups: dict = defaultdict(list)
    for r in steps:
        groups[(r["verified"], r["draft_source"])].append(r)
    lines = ["| step kind | steps | action = AR's | AR's translation, mean mm | distance from "
             "AR's, mean mm | length / AR's | progress along AR's / AR's |",
             "| --- | --- | --- | --- | --- | --- | --- |"]

    def line(name: str, part: list[dict]) -> str:
        executed = np.array([r["action"] for r in part])
        ar = np.array([r["ar"] for r in part])
        length, ar_length = (np.linalg.norm(x[:, :3], axis=1) for x in (executed, ar))
        moving = ar_length > 1e-3   # AR moves the tool by more than 1 mm
        along = (executed[:, :3] * ar[:, :3]).sum(1) / np.maximum(ar_length, 1e-12)
        same = np.all(np.isclose(executed, ar, rtol=0, atol=1e-9), axis=1)
        distance = np.linalg.norm(executed[:, :3] - ar[:, :3], axis=1)
        ratio = (length[moving].sum() / ar_length[moving].sum()) if moving.any() else float("nan")
        progress = (along[moving].sum() / ar_length[moving].sum()) if moving.any() \
            else float("nan")
        return (f"| {name} | {len(part)} ({len(part) / len(steps):.0%}) | {same.mean():.0%} | "
                f"{1e3 * ar_length.mean():.1f} | {1e3 * distance.mean():.1f} | {ratio:.2f} | "
                f"**{progress:.2f}** |")

    for key, part in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        lines.append(line(KIND_NAMES.get(key, f"{'verified' if key[0] else 'not verified'}, "
                                              f"{key[1] or 'no draft'}"), part))
    lines.append(line("**all**", steps))
    return "\n".join(lines)


def main(argv=None) -> int:
    """Run the method with AR beside it (or read ``--table``) and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--method", default="heisd_behind")
    parser.add_argument("--suites", nargs="+", default=list(STATIC_SUITES))
    parser.add_argument("--episodes", type=int, default=2, help="per task")
    parser.add_argument("--seed", type=int, default=100, help="first episode's seed")
    parser.add_argument("--db", default=None, help="heisd-build-db directory (required to run)")
    parser.add_argument("--calibration", default=None)
    parser.add_argument("--skip-threshold", type=float, default=None)
    parser.add_argument("--accept-token-max-bins", type=int, default=None)
    parser.add_argument("--accept-group-sum-max-bins", type=int, default=None)
    parser.add_argument("--target", default=None, help="small VLA (default: the shipped one)")
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="progress_against_ar.jsonl")
    parser.add_argument("--table", default=None, metavar="JSONL",
                        help="only print the table of an earlier --out")
    args = parser.parse_args(argv)
    if not args.table and not args.db:
        parser.error("--db: required to run a method (or --table JSONL to summarise one)")
    if args.table:
        rows = [json.loads(line) for line in Path(args.table).read_text().splitlines() if line]
    else:
        import torch

        torch.set_num_threads(args.threads)
        rows = run(args)
        Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
        ends = [r for r in rows if "successes" in r]
        sys.stdout.write(f"{sum(r['successes'] for r in ends)} of "
                         f"{sum(len(r['steps']) for r in ends)} episodes succeeded, "
                         f"{sum(sum(r['steps']) for r in ends)} steps\n")
    sys.stdout.write(progress_table(rows) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
