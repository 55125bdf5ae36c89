r"""heisd-model: show a small-VLA checkpoint, or set the gripper decision rule it carries.

``set-gripper-rule`` stores the rule's switch probability P in the checkpoint's metadata
(``gripper_switch_probability``; the top-level README's "Gripper decision rule"): the
gripper changes state when the other state's total probability reaches P. Only the metadata
changes; the tensors are written back bit for bit, so the model's fingerprint, its retrieval
DB, calibration and draft head stay valid. ``none`` removes the rule (plain greedy).

Examples:
    heisd-model set-gripper-rule runs/p4/small_vla.safetensors 0.4
    heisd-model set-gripper-rule runs/p4/small_vla.safetensors none
    heisd-model info heisd_ros/assets/small_vla.safetensors
"""

from __future__ import annotations

import argparse
import json
import sys


def describe(path) -> dict:
    """What ``load_small_vla(path)`` reports: config, size, statistics, rule, fingerprint."""
    from heisd_ros.models.checkpoint import load_small_vla
    from heisd_ros.retrieval.embedding import model_fingerprint

    vla = load_small_vla(path)
    return {"path": str(path), "config": json.loads(vla.config.to_json()),
            "parameters": sum(p.numel() for p in vla.net.parameters()),
            "action_stats": vla.action_stats is not None,
            "gripper_switch_probability": vla.gripper_switch_probability,
            "fingerprint": model_fingerprint(vla)}


def parse_args(argv=None) -> argparse.Namespace:
    """Command line of ``heisd-model``."""
    parser = argparse.ArgumentParser(prog="heisd-model", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    rule = commands.add_parser("set-gripper-rule",
                               help="store the gripper decision rule's switch probability")
    rule.add_argument("model", help="small-VLA safetensors (changed in place)")
    rule.add_argument("probability", metavar="P",
                      help="switch probability in (0, 1), or 'none' for plain greedy")
    info = commands.add_parser("info", help="print what the checkpoint holds (JSON)")
    info.add_argument("model", help="small-VLA safetensors")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    """Entry point of ``heisd-model``."""
    args = parse_args(argv)
    if args.command == "set-gripper-rule":
        from heisd_ros.models.checkpoint import (
            check_gripper_switch_probability,
            set_gripper_switch_probability,
        )

        try:
            value = check_gripper_switch_probability(args.probability, "P")
            set_gripper_switch_probability(args.model, value)
        except (OSError, ValueError) as err:
            print(f"heisd-model: {err}", file=sys.stderr)
            return 2
    try:
        report = describe(args.model)
    except (OSError, ValueError) as err:
        print(f"heisd-model: {err}", file=sys.stderr)
        return 2
    if args.command == "set-gripper-rule":
        report = {k: report[k] for k in ("path", "gripper_switch_probability", "fingerprint")}
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
