r"""heisd-bench: measure decoding speed and fidelity side by side.

Subcommands:
    decode   AR, drafter-exact and drafter-relaxed on the same observations, interleaved,
             after warm-up; prints a table and writes --json.
    profile  the cost of each building block (vision, prefill, one decode forward, a tree
             forward, one draft-head forward) and the ratios the design relies on.

Examples:
    heisd-bench decode --drafter runs/drafter/draft_head.safetensors --observations 64 \
        --seed 0 --json bench.json
    heisd-bench decode --target small_vla.safetensors \
        --drafter runs/drafter/draft_head.safetensors --relaxed-radius 9,9,9,9,9,9,0
    heisd-bench profile --json profile.json

Observations are the seeded synthetic scenes until recorded ones are wired in.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from heisd_ros.tools._common import int_vector, load_target, set_threads

_COLUMNS = (("mode", 18), ("fwd/action", 11), ("AL", 6), ("draft tok", 10), ("ms median", 10),
            ("ms p90", 8), ("speed-up", 9), ("exact tok", 10), ("mean |dbin|", 12))


def format_table(summary: dict[str, dict]) -> str:
    """Plain-text table of :func:`heisd_ros.decoding.bench_runner.summarise` output."""
    lines = ["".join(name.ljust(width) for name, width in _COLUMNS)]
    for mode, s in summary.items():
        dev = s["agreement_with_ar"]["mean_bin_deviation_per_dim"]
        cells = [mode, f"{s['target_forwards_per_action']:.2f}", f"{s['al']:.2f}",
                 f"{s['draft_tokens_per_action']:.2f}", f"{s['ms_per_action']['median']:.1f}",
                 f"{s['ms_per_action']['p90']:.1f}", f"{s['speedup_vs_ar']:.2f}x",
                 f"{s['agreement_with_ar']['exact_token_rate']:.3f}", f"{sum(dev) / len(dev):.2f}"]
        lines.append("".join(c.ljust(w) for c, (_, w) in zip(cells, _COLUMNS, strict=True)))
    return "\n".join(lines)


def run_decode(args) -> dict:
    """The ``decode`` subcommand: AR, drafter-exact, drafter-relaxed; returns the JSON."""
    import torch

    from heisd_ros.decoding.acceptance import RelaxedRule, exact_rule
    from heisd_ros.decoding.bench_runner import run_interleaved, summarise
    from heisd_ros.decoding.decoder import ActionDecoder
    from heisd_ros.decoding.drafter_source import DrafterSource, DraftTreeConfig
    from heisd_ros.models.checkpoint import load_draft_head
    from heisd_ros.models.synthetic_scenes import SyntheticScenes

    target, description = load_target(args.target, args.seed)
    head = load_draft_head(args.drafter, target)
    tree = DraftTreeConfig(top_k=args.top_k, max_depth=args.depth, node_budget=args.budget)
    radius = int_vector(args.relaxed_radius, 7, "--relaxed-radius")
    modes = {"ar": ActionDecoder(target),
             "drafter-exact": ActionDecoder(target, DrafterSource(head, target, tree), exact_rule),
             "drafter-relaxed": ActionDecoder(target, DrafterSource(head, target, tree),
                                              RelaxedRule(radius))}
    scenes = list(SyntheticScenes(args.observations + args.warmup, seed=args.seed))
    records = run_interleaved(modes, scenes[args.warmup:], warmup=scenes[:args.warmup])
    return {"target": description, "drafter": str(args.drafter), "observations": args.observations,
            "warmup": args.warmup, "seed": args.seed, "threads": torch.get_num_threads(),
            "tree": asdict(tree), "relaxed_radius_bins": list(radius),
            "modes": summarise(records)}


def run_profile(args) -> dict:
    """The ``profile`` subcommand: cost of each building block; returns the JSON."""
    from heisd_ros.decoding.bench_runner import cost_profile
    from heisd_ros.models.checkpoint import load_draft_head
    from heisd_ros.models.draft_head import DraftHead, DraftHeadConfig
    from heisd_ros.models.synthetic_scenes import SyntheticScenes

    target, description = load_target(args.target, args.seed)
    head = (load_draft_head(args.drafter, target) if args.drafter
            else DraftHead(DraftHeadConfig.for_target(target)).eval())
    obs = SyntheticScenes(1, seed=args.seed).scene(0)
    profile = cost_profile(target, head, obs, tree_nodes=args.budget, draft_nodes=args.top_k,
                           repeats=args.repeats)
    params = sum(p.numel() for p in target.net.parameters()) if hasattr(target, "net") else None
    return {"target": description, "target_parameters": params, **profile}


def parse_args(argv=None) -> argparse.Namespace:
    """Command line of ``heisd-bench``."""
    parser = argparse.ArgumentParser(prog="heisd-bench", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("decode", "profile"):
        p = sub.add_parser(name)
        p.add_argument("--target", default=None, help="small-VLA safetensors (default: shipped "
                       "weights if present, else a seeded random init)")
        p.add_argument("--drafter", default=None, required=name == "decode",
                       help="draft head safetensors from heisd-train-drafter")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--json", default=None, help="write the results here")
        p.add_argument("--top-k", type=int, default=4)
        p.add_argument("--budget", type=int, default=16, help="draft tree node budget")
        p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    decode, profile = sub.choices["decode"], sub.choices["profile"]
    decode.add_argument("--observations", type=int, default=32)
    decode.add_argument("--warmup", type=int, default=2)
    decode.add_argument("--depth", type=int, default=6)
    decode.add_argument("--relaxed-radius", default="9,9,9,9,9,9,0",
                        help="per-dimension bins (gripper last), or one value for all")
    profile.add_argument("--repeats", type=int, default=20)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    """Entry point of ``heisd-bench``."""
    args = parse_args(argv)
    set_threads(args.threads)
    if args.command == "decode":
        result = run_decode(args)
        print(format_table(result["modes"]))
    else:
        result = run_profile(args)
        print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
