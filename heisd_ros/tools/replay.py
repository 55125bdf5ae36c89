r"""heisd-replay: open-loop replay of a rosbag2 through AR and other decoding methods.

Every paired frame (primary camera + wrist camera + latest joint state and EE pose) is decoded
by AR and each chosen method; the report gives, per frame and in total, agreement with AR
(exact tokens, bin deviation per dimension, translation error in mm, gripper agreement), AL,
target forwards per action, speed-up and router mode, plus the OpenVLA-7B projection.

Examples:
    heisd-replay bags/episode_000000_bag --methods ar drafter --report runs/replay
    heisd-replay my_robot_bag --topic-primary /cam_high/image_raw --topic-wrist /cam_wrist/image \
        --topic-joint-states /piper/joint_states --instruction "put the cup on the plate" \
        --max-frames 50 --json replay.json
    heisd-replay my_bag --topic-wrist ''      # a robot without a wrist camera

Cameras may be sensor_msgs/Image (rgb8, bgr8, mono8) or CompressedImage (jpeg, png), each
camera its own, converted as the policy node converts them. A camera option left unset takes
the default topic, or its image_transport ``/compressed`` topic when only that is in the bag.

Pairing (the rule of every tool, heisd_ros.data.pairing): each primary frame takes the wrist
frame nearest in header stamp, earlier or later, within --max-skew-s (50 ms), and the joint
state and EE pose nearest to it within --max-state-skew-s (0.5 s, the policy node's
default); a wrist frame may serve several primary frames. --rate-hz thins the primary frames
to a control rate. The report's "frames:" line gives what was found, paired and dropped, and
why.

The robot state is required (the model's proprioception and the router's EE position):
a bag without it, or a JointState without the gripper joint (--gripper-joint; piper_ros
names it joint7), stops with the remap to use; --without-state replays without it and says
so in the report.

A bag that cannot be replayed (missing topics, other message types or image encodings, empty,
truncated, split with missing parts, unsupported metadata) gets a message naming the cause
and the fix, and exit code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys

from heisd_ros.data.bag_topics import (
    BagTopics,
    add_topic_arguments,
    option,
    resolve_cameras,
    topic_options,
)
from heisd_ros.eval.bag_frames import DEFAULT_STATE_TOLERANCE_S, REPLAY_ROLES, FrameOptions


def build_parser() -> argparse.ArgumentParser:
    """Command-line options."""
    from heisd_ros.decoding.methods import METHOD_NAMES
    from heisd_ros.tools._common import add_decoder_arguments

    p = argparse.ArgumentParser(prog="heisd-replay", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bag", help="rosbag2 directory (the one holding metadata.yaml)")
    p.add_argument("--methods", nargs="+", default=["ar", "drafter"],
                   help=f"methods besides AR, from {list(METHOD_NAMES)} (AR is always run)")
    add_topic_arguments(p, REPLAY_ROLES, optional=("wrist",), find_compressed=True)
    p.add_argument("--gripper-joint", default="gripper",
                   help="JointState name of the gripper width (piper_ros: joint7)")
    p.add_argument("--without-state", action="store_true",
                   help="replay without joint states and EE pose (no proprioception; every "
                        "action may change; the report says so)")
    p.add_argument("--instruction", default=None,
                   help="task instruction (default: the bag's heisd.instruction custom data)")
    p.add_argument("--task", default=None, help="retrieval DB collection (default: the bag's "
                   "heisd.task custom data, else the instruction)")
    p.add_argument("--max-frames", type=int, default=None, help="stop after this many frames")
    p.add_argument("--max-skew-s", type=float, default=0.05,
                   help="largest stamp difference of paired camera frames, s")
    p.add_argument("--max-state-skew-s", type=float, default=DEFAULT_STATE_TOLERANCE_S,
                   help="largest stamp difference of a frame and its robot state, s")
    p.add_argument("--rate-hz", type=float, default=None,
                   help="replay at most this many primary frames per second (default: every "
                        "frame)")
    add_decoder_arguments(p)
    p.add_argument("--latency-profile", default="openvla-7b-paper",
                   help="profile the projection prices each action's counters with: a shipped "
                        "name, a YAML file (heisd-bench decode --latency-profile-out) or "
                        "fixed:<ms> (default: openvla-7b-paper)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--report", default=None, help="write report.md and PNG plots here")
    return p


def resolve_topics(args) -> BagTopics:
    """The ``--topic-*`` options, an unset camera resolved in the bag (default or /compressed)."""
    from heisd_ros.data.rosbag_io import metadata_topics

    present = metadata_topics(args.bag)  # {} for no bag: inspect_bag then says why
    return BagTopics(**resolve_cameras(topic_options(args, REPLAY_ROLES), present))


def frame_options(args) -> FrameOptions:
    """The pairing options of the command line."""
    return FrameOptions(pair_tolerance_s=args.max_skew_s,
                        state_tolerance_s=args.max_state_skew_s, rate_hz=args.rate_hz,
                        gripper_joint=args.gripper_joint, without_state=args.without_state)


def check_cameras(info, topics: BagTopics) -> None:
    """Convert the first image of each camera topic as replay will.

    Raises:
        BagError: an image the policy would refuse (encoding or format named, with the topic
            and what is accepted), or a bag whose messages cannot be read.
    """
    from heisd_ros.data.rosbag_io import READ_ERRORS, first_messages, image_from_msg
    from heisd_ros.eval.bag_frames import BagError

    options = {topics.primary: option("primary"), topics.wrist: option("wrist")}
    cameras = [t for t in (topics.primary, topics.wrist) if t]
    try:
        first = first_messages(info.path, cameras)
    except READ_ERRORS as err:
        raise BagError(f"{info.path}: the camera messages cannot be read ({err}); the bag is "
                       f"probably truncated") from err
    for topic, msg in first.items():
        try:
            image_from_msg(msg)
        except ValueError as err:
            raise BagError(
                f"{topic} ({info.topics[topic][0]}): {err}. Replay, like the policy node, "
                f"needs sensor_msgs/msg/Image in rgb8, bgr8 or mono8, or "
                f"sensor_msgs/msg/CompressedImage in jpeg or png: convert the camera (e.g. "
                f"image_proc, image_transport republish) or remap with {options[topic]} "
                f"TOPIC") from err


def run(args) -> dict:
    """Check the bag, decode its frames with every method, return the result JSON."""
    from tqdm import tqdm

    from heisd_ros.data.pairing import PairingReport
    from heisd_ros.eval.bag_frames import BagError, inspect_bag, iter_frames
    from heisd_ros.eval.methods import (
        build_method,
        check_methods,
        context_from_args,
    )
    from heisd_ros.eval.projection import project
    from heisd_ros.eval.replay import replay_frames, summarise_replay
    from heisd_ros.latency.profile import load_profile

    methods = check_methods(args.methods)
    profile = load_profile(args.latency_profile)   # before the bag and the models
    topics = resolve_topics(args)
    options = frame_options(args)
    info = inspect_bag(args.bag, topics, options)
    check_cameras(info, topics)  # before the models load
    instruction = args.instruction or info.custom_data.get("heisd.instruction")
    if not instruction:
        raise BagError(f"{info.path}: the bag carries no instruction (custom data "
                       f"heisd.instruction); pass --instruction TEXT")
    if args.max_frames is not None and args.max_frames < 1:
        raise ValueError(f"--max-frames: expected >= 1, got {args.max_frames}")
    pairing = PairingReport()
    observations = iter_frames(info, topics, instruction, args.max_frames, options, pairing)
    first = next(observations)  # before the models load: the first pass pairs (or says why not)
    ctx, desc = context_from_args(args, methods, warn=_warn)
    ctx.use_suite(info.custom_data.get("heisd.suite"))
    decoders = {m: build_method(m, ctx) for m in methods}
    total = pairing.paired if args.max_frames is None else min(pairing.paired, args.max_frames)
    with tqdm(total=total, unit="frame", file=sys.stderr) as bar:
        frames = replay_frames(decoders, itertools.chain([first], observations),
                               progress=lambda n: bar.update(1),
                               task=args.task or info.custom_data.get("heisd.task"))
    summary = summarise_replay(frames)
    for warning in info.warnings:
        _warn(warning)
    return {"bag": str(info.path), "storage": info.storage, "files": info.files,
            "topics": {r: getattr(topics, r) for r in REPLAY_ROLES},
            "pairing": pairing.as_dict(), "frame_options": dataclasses.asdict(options),
            "warnings": list(info.warnings), "instruction": instruction,
            **desc, "methods": summary,
            "projection": project({m: [f["methods"][m] for f in frames] for m in methods},
                                  profile),
            "frames": frames}


def _warn(message: str) -> None:
    """A warning (an untrained draft head, a replay without robot state), on stderr."""
    print(f"heisd-replay: WARNING: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``heisd-replay``; exit 2 on a bag or option that cannot be used."""
    args = build_parser().parse_args(argv)
    from heisd_ros.eval import report
    from heisd_ros.eval.replay import table_rows, write_replay_report
    from heisd_ros.tools._common import set_threads

    set_threads(args.threads)
    try:
        result = run(args)
    except (ValueError, FileNotFoundError) as err:  # BagError included: no traceback
        print(f"heisd-replay: {err}", file=sys.stderr)
        return 2
    print(result["pairing"]["line"])
    print(report.format_table(*table_rows(result["methods"])))
    print(result["projection"]["label"] + ": " + ", ".join(
        f"{n} " + ("-" if r["projected_speedup_vs_ar"] is None
                   else f"{r['projected_speedup_vs_ar']:.2f}x")
        for n, r in result["projection"]["methods"].items()))
    if args.report:
        result["report_files"] = write_replay_report(args.report, result)
        print(f"report: {result['report_files']['markdown']}")
    if args.json:
        report.write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
