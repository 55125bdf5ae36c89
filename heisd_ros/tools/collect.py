r"""heisd-collect: record scripted demonstrations in the simulated PIPER tabletop.

Examples:
    heisd-collect --suites piper_goal --episodes 10 --out demos
    heisd-collect --suites piper_spatial piper_object --tasks block_left_of_plate \\
        --episodes 5 --seed 100 --format both --out demos
    heisd-collect --suites piper_long --episodes 2 --format mcap --out bags --overwrite
    heisd-collect --suites piper_goal --episodes 50 --seed 2000 --execution-noise-m 0.003 \\
        --execution-noise-rad 0.003 --out demos_dart    # DART: the arm executes label + noise
    heisd-collect --suites piper_object --episodes 40 --seed 8000 --takeover-policy \\
        heisd_ros/assets/small_vla.safetensors --takeover-steps 5 60 --out demos_takeover
        # DAgger-style: the VLA (AR) drives, the expert takes over and finishes; recorded
        # from the take-over on
    heisd-collect --suites piper_spatial piper_object piper_goal piper_long --episodes 25 \
        --seed 1000 --policy-rollouts heisd_ros/assets/small_vla.safetensors --out rollouts
        # the VLA's own successful episodes, its actions as labels (a DB of the target's paths)

Each task gets --episodes attempts with seeds --seed, --seed + 1, ...; attempts the scripted
expert fails are dropped and counted. Output: <out>/<suite>/<task>/episode_<seed>.npz (compact
format, see heisd_ros.data.npz_episodes) and/or episode_<seed>_bag/ (rosbag2, MCAP or
sqlite3), plus <out>/summary.json (every run into <out>, merged). Needs MUJOCO_GL=egl (or
glfw/osmesa) for rendering. Stopped part-way (Ctrl-C or SIGTERM), it still adds the attempts
that finished to summary.json, says where it stopped and exits with 130.
"""

from __future__ import annotations

import argparse
import sys

from heisd_ros.sim.collection import (
    FORMATS,
    CollectConfig,
    CollectionStopped,
    collect,
    summary_lines,
    write_summary,
)
from heisd_ros.sim.config import SimConfig
from heisd_ros.sim.demos import ExecutionNoise
from heisd_ros.sim.expert import ExpertConfig
from heisd_ros.sim.suites import list_suites
from heisd_ros.tools._common import sigterm_as_interrupt


def build_parser() -> argparse.ArgumentParser:
    """Command-line options."""
    parser = argparse.ArgumentParser(prog="heisd-collect", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suites", nargs="+", required=True,
                        help=f"suite names, from {list_suites()}")
    parser.add_argument("--tasks", nargs="*", default=[], help="only these tasks (default all)")
    parser.add_argument("--episodes", type=int, default=10, help="attempts per task")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first attempt")
    parser.add_argument("--out", default="demos", help="output directory")
    parser.add_argument("--format", choices=FORMATS, default="npz",
                        help="npz, rosbag2 mcap / sqlite3, or both (npz + mcap)")
    parser.add_argument("--image-size", type=int, default=224, help="camera width = height, px")
    parser.add_argument("--max-steps", type=int, default=None,
                        help="step limit per episode (default: the task's own)")
    parser.add_argument("--overwrite", action="store_true", help="replace existing episodes")
    parser.add_argument("--execution-noise-m", type=float, default=0.0,
                        help="DART: std of noise added to the executed translation per step, m "
                             "(the recorded label stays the expert's action)")
    parser.add_argument("--execution-noise-rad", type=float, default=0.0,
                        help="DART: std of noise added to the executed rotation per step, rad")
    parser.add_argument("--kick-probability", type=float, default=0.0,
                        help="DART kicks: chance per step of a large translation offset "
                             "(with --kick-m)")
    parser.add_argument("--kick-m", type=float, default=0.0,
                        help="DART kicks: std per axis of a kick's translation, m")
    expert = ExpertConfig()
    parser.add_argument("--transit-head-start", type=float, default=expert.transit_head_start,
                        help="expert: fraction of the minimum-jerk profile a transit skips, so "
                             "it starts moving at once (0 = from rest, the first datasets' expert)")
    parser.add_argument("--gripper-lead-steps", type=int, default=expert.gripper_lead_steps,
                        help="expert: steps before the tool arrives at which the gripper "
                             "command changes (0 = on arrival); a dataset's summary.json "
                             "records the value each run used")
    parser.add_argument("--grasp-wait-steps", type=int, default=expert.grasp_wait_steps,
                        help="expert: steps it holds still after closing the gripper "
                             "(the first datasets' expert: 5)")
    parser.add_argument("--release-wait-steps", type=int, default=expert.release_wait_steps,
                        help="expert: steps it holds still after opening the gripper "
                             "(the first datasets' expert: 4)")
    parser.add_argument("--takeover-policy", metavar="VLA", default=None,
                        help="a small VLA checkpoint that drives each attempt (AR decoding with "
                             "its gripper rule) until the expert takes over; only the expert's "
                             "part is recorded (states the policy reached, expert labels)")
    parser.add_argument("--takeover-steps", type=int, nargs=2, metavar=("FIRST", "LAST"),
                        default=(5, 60),
                        help="with --takeover-policy: the take-over step, uniform in "
                             "[FIRST, LAST], seeded per attempt")
    parser.add_argument("--takeover-unrecorded-steps", type=int, default=0, metavar="N",
                        help="with --takeover-policy: the expert's first N steps after the "
                             "take-over are executed but not recorded (its plan starts each "
                             "segment from rest)")
    parser.add_argument("--policy-rollouts", metavar="VLA", default=None,
                        help="a small VLA checkpoint that drives each attempt alone (AR "
                             "decoding with its gripper rule); its successful episodes are "
                             "recorded with its own actions as labels (a retrieval DB of the "
                             "target's own paths)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads of the policy (--takeover-policy, --policy-rollouts)")
    return parser


def _policy(args):
    """The policy of --takeover-policy or --policy-rollouts, or (None, "") without one.

    Returns (DecoderPolicy with AR decoding, description).
    """
    if args.takeover_policy is not None and args.policy_rollouts is not None:
        raise ValueError("--takeover-policy and --policy-rollouts: choose one")
    option, path = (("--takeover-policy", args.takeover_policy)
                    if args.takeover_policy is not None
                    else ("--policy-rollouts", args.policy_rollouts))
    if path is None:
        return None, ""
    from pathlib import Path

    if not Path(path).is_file():
        raise ValueError(f"{option}: {path} is not a file (a small VLA checkpoint, "
                         f".safetensors)")
    import torch

    from heisd_ros.eval.methods import DecoderPolicy, build_method, make_context

    torch.set_num_threads(max(1, args.threads))
    ctx, desc = make_context(["ar"], target_path=path)
    return DecoderPolicy(build_method("ar", ctx)), f"ar: {desc['target']}"


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``heisd-collect``; returns the process exit code."""
    args = build_parser().parse_args(argv)
    from tqdm import tqdm

    try:
        config = CollectConfig(suites=tuple(args.suites), tasks=tuple(args.tasks),
                               episodes=args.episodes, seed=args.seed, out_dir=args.out,
                               fmt=args.format, overwrite=args.overwrite,
                               max_steps=args.max_steps,
                               noise=ExecutionNoise(args.execution_noise_m,
                                                    args.execution_noise_rad,
                                                    args.kick_probability, args.kick_m),
                               takeover_steps=(tuple(args.takeover_steps)
                                               if args.takeover_policy else None),
                               takeover_unrecorded_steps=args.takeover_unrecorded_steps,
                               policy_rollouts=args.policy_rollouts is not None)
        policy, policy_desc = _policy(args)
        sim_config = SimConfig(image_width_px=args.image_size, image_height_px=args.image_size)
        expert_config = ExpertConfig(transit_head_start=args.transit_head_start,
                                     gripper_lead_steps=args.gripper_lead_steps,
                                     grasp_wait_steps=args.grasp_wait_steps,
                                     release_wait_steps=args.release_wait_steps)
        with tqdm(total=config.total_attempts, unit="episode") as bar:
            counts = {"kept": 0, "dropped": 0}

            def progress(suite: str, task: str, seed: int, kept: bool) -> None:
                counts["kept" if kept else "dropped"] += 1
                bar.set_postfix(task=task, **counts)
                bar.update(1)

            with sigterm_as_interrupt():  # the summary is written on either signal
                summary = collect(config, sim_config, expert_config, progress=progress,
                                  policy=policy, policy_description=policy_desc)
    except ValueError as err:
        print(f"heisd-collect: {err}", file=sys.stderr)
        return 2
    except CollectionStopped as stop:
        path = write_summary(args.out, stop.summary)
        print("\n".join(summary_lines(stop.summary)))
        print(f"summary: {path}")
        where = stop.summary["stopped_at"]
        print("heisd-collect: stopped part-way" + (
            f" at {where['suite']}/{where['task']}, seed {where['seed']} (not recorded)"
            if where else ""), file=sys.stderr)
        return 130
    path = write_summary(args.out, summary)
    print("\n".join(summary_lines(summary)))
    print(f"summary: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
