r"""heisd-record: record simulated closed-loop runs to rosbag2 (MCAP or sqlite3).

A policy (a decoding method from the registry, or the scripted expert) runs on one task for
--episodes seeded episodes; each episode becomes one bag with the robot's topics (cameras,
/joint_states, /ee_pose, /heisd/ee_command) and, for decoding methods, /heisd/hybrid_step.

Examples:
    heisd-record --suite piper_goal --task red_block_on_plate --policy ar --episodes 2 \
        --out runs/bags
    heisd-record --suite piper_goal --task red_block_on_plate --policy expert --storage sqlite3 \
        --episodes 5 --seed 100 --out runs/expert_bags
    heisd-record --suite piper_goal --task red_block_on_plate --policy expert \
        --camera-format jpeg --out runs/jpeg_bags  # CompressedImage on <camera>/compressed
    heisd-replay runs/bags/piper_goal/red_block_on_plate/episode_000000_bag --methods drafter
    heisd-record --suite piper_goal --task red_block_on_plate --policy heisd --db db_openvla \
        --model openvla --checkpoint ckpt/openvla-7b-ft --unnorm-key KEY --out runs/bags

Needs MUJOCO_GL=egl (or glfw/osmesa) for rendering.
"""

from __future__ import annotations

import argparse
import json
import sys


def build_parser() -> argparse.ArgumentParser:
    """Command-line options."""
    from heisd_ros.data.rosbag_io import CAMERA_FORMATS
    from heisd_ros.decoding.methods import METHOD_NAMES
    from heisd_ros.tools._common import add_decoder_arguments

    p = argparse.ArgumentParser(prog="heisd-record", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", required=True, help="suite name")
    p.add_argument("--task", required=True, help="task name of the suite")
    p.add_argument("--policy", default="ar", help=f"'expert' or a method: {list(METHOD_NAMES)}")
    p.add_argument("--episodes", type=int, default=1)
    p.add_argument("--seed", type=int, default=0, help="seed of the first episode")
    p.add_argument("--max-steps", type=int, default=None, help="default: the task's limit")
    p.add_argument("--storage", choices=("mcap", "sqlite3"), default="mcap")
    p.add_argument("--out", default="bags", help="output root")
    p.add_argument("--image-size", type=int, default=224, help="camera width = height, px")
    p.add_argument("--camera-format", choices=CAMERA_FORMATS, default="rgb8",
                   help="cameras as sensor_msgs/Image in this encoding (rgb8, bgr8, mono8) or, "
                        "as image_transport's compressed transport, CompressedImage (jpeg, png) "
                        "on <camera topic>/compressed")
    add_decoder_arguments(p, closed_loop=True)
    p.add_argument("--overwrite", action="store_true",
                   help="replace the bags of these seeds if they exist")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    return p


def run(args) -> list[dict]:
    """Build the policy and record; returns the per-episode summaries."""
    from tqdm import tqdm

    from heisd_ros.eval.recording import record_runs
    from heisd_ros.sim.config import SimConfig
    from heisd_ros.sim.env import PiperSimEnv
    from heisd_ros.sim.suites import get_task

    if args.episodes < 1:
        raise ValueError(f"--episodes: expected >= 1, got {args.episodes}")
    config = SimConfig(image_width_px=args.image_size, image_height_px=args.image_size)
    env = PiperSimEnv(get_task(args.suite, args.task), config)
    try:
        if args.policy == "expert":
            from heisd_ros.sim.expert import ScriptedExpert

            policy = ScriptedExpert(env)
        else:
            from heisd_ros.eval.methods import (
                DecoderPolicy,
                build_method,
                check_methods,
                context_from_args,
            )

            check_methods([args.policy], "--policy")
            ctx, _ = context_from_args(args, [args.policy], warn=_warn, closed_loop=True)
            ctx.use_suite(args.suite)
            policy = DecoderPolicy(build_method(args.policy, ctx), task=args.task)
        with tqdm(total=args.episodes, unit="episode", file=sys.stderr) as bar:
            return record_runs(policy, args.suite, args.task, args.episodes, args.seed, args.out,
                               storage=args.storage, max_steps=args.max_steps, env=env,
                               progress=lambda n, ok: bar.update(1),
                               camera_format=args.camera_format, overwrite=args.overwrite)
    finally:
        env.close()


def _warn(message: str) -> None:
    """A warning about the models in use (an untrained draft head), on stderr."""
    print(f"heisd-record: WARNING: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``heisd-record``; exit 2 on bad options."""
    args = build_parser().parse_args(argv)
    from heisd_ros.tools._common import set_threads

    set_threads(args.threads)
    try:
        episodes = run(args)
    except (ValueError, FileNotFoundError) as err:  # e.g. a --target that does not exist
        print(f"heisd-record: {err}", file=sys.stderr)
        return 2
    for e in episodes:
        print(json.dumps(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
