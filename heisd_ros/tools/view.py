r"""heisd-view: see what the robot and the router do, in Rerun.

Shows both cameras, the PIPER moving (from the project's URDF and the joint states), the EE
path coloured by step kind (AR, drafter, retrieval verified, retrieval unverified, checked
behind: pending, confirmed, rejected), per-step scalars (latency, accepted length, the
router's F, command age) and each step's status line.

Sources:
    bag PATH...   rosbag2 recordings (``heisd-record``'s, or ``ros2 bag record`` of the live
                  system; ``--topic-*`` remaps); a folder is searched for bags
    live          the running graph (/heisd/hybrid_step, /joint_states, the cameras, the
                  commands and /heisd/episode_status), until Ctrl-C or --duration-s
    open FILE.rrd a saved recording (``--save``, or ``heisd-eval --view DIR``)

Outputs: ``--save FILE.rrd`` writes a recording (a folder with several bags); ``--web``
serves Rerun's web viewer on localhost and prints its address; by default the native viewer
is spawned where a display exists (else the web viewer is served).

Examples:
    heisd-view bag runs/demo/bags/piper_goal/red_block_on_plate/episode_009000_bag
    heisd-view bag runs/demo/bags --save runs/demo/view.rrd
    heisd-view live --web
    heisd-eval --suites piper_goal --methods ar heisd --episodes 1 --db DB --view runs/view
    heisd-view open runs/view/piper_goal/red_block_on_plate/heisd_seed0.rrd --web

Needs the Rerun SDK (``pip install 'rerun-sdk==0.41.0'``; ``make setup`` installs it).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    """Command-line options."""
    from heisd_ros.data.bag_episodes import EPISODE_OPTIONAL, EPISODE_ROLES
    from heisd_ros.data.bag_topics import add_topic_arguments

    p = argparse.ArgumentParser(prog="heisd-view", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="source", required=True)
    bag = sub.add_parser("bag", help="rosbag2 recordings")
    bag.add_argument("paths", nargs="+", help="bag folders, or folders holding bags")
    bag.add_argument("--gripper-joint", default="gripper",
                     help="JointState name of the gripper opening (piper_ros: joint7)")
    add_topic_arguments(bag, EPISODE_ROLES, optional=EPISODE_OPTIONAL, find_compressed=True)
    live = sub.add_parser("live", help="the running graph")
    live.add_argument("--duration-s", type=float, default=None,
                      help="stop after this long (default: until Ctrl-C)")
    live.add_argument("--path-steps", type=int, default=1000,
                      help="newest steps drawn in the path")
    live.add_argument("--gripper-joint", default="gripper")
    opened = sub.add_parser("open", help="a saved .rrd recording")
    opened.add_argument("file")
    for s in (bag, live, opened):
        out = s.add_argument_group("output")
        if s is not opened:
            out.add_argument("--save", default=None, metavar="FILE.rrd",
                             help="write a recording (a folder for several bags)")
        out.add_argument("--web", action="store_true", help="serve Rerun's web viewer")
        out.add_argument("--web-port", type=int, default=9090)
        out.add_argument("--grpc-port", type=int, default=9876)
        out.add_argument("--serve-s", type=float, default=None,
                         help="with --web: stop serving after this long (default: Ctrl-C)")
    return p


def _output(args, save: str | None = None):
    from heisd_ros.viewer.output import Output

    return Output(save=save, web=args.web, web_port=args.web_port, grpc_port=args.grpc_port)


def view_bags(args) -> bool:
    """``bag``: one recording per bag; True when one is served (the web viewer)."""
    from heisd_ros.data.bag_episodes import EPISODE_ROLES, EpisodeTopics, find_bags, is_bag
    from heisd_ros.data.bag_topics import resolve_cameras, topic_options
    from heisd_ros.data.rosbag_io import metadata_topics
    from heisd_ros.viewer.episode_log import EpisodeLog
    from heisd_ros.viewer.files import log_steps
    from heisd_ros.viewer.output import open_recording
    from heisd_ros.viewer.sources import bag_steps

    options = topic_options(args, EPISODE_ROLES)
    bags = [b for p in args.paths for b in ([Path(p)] if is_bag(p) else find_bags(p))]
    if not bags:
        raise ValueError(f"{args.paths}: no rosbag2 bag found (a bag is a folder with "
                         f"metadata.yaml)")
    saves: list[str | None] = [args.save] if args.save and len(bags) == 1 else [
        str(Path(args.save) / f"{b.name}.rrd") if args.save else None for b in bags]
    served = False
    for bag, save in zip(bags, saves, strict=True):
        # an unset camera: its default topic, or the /compressed one when only that is there
        topics = EpisodeTopics(**resolve_cameras(options, metadata_topics(bag)))
        record, steps = bag_steps(bag, topics, args.gripper_joint)
        if save:
            Path(save).parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        recording, url = open_recording(_output(args, save),
                                        f"{record.suite}/{record.task} seed {record.seed}")
        log = log_steps(EpisodeLog(recording), steps)
        recording.flush()
        kinds = {k: log.kinds.count(k) for k in dict.fromkeys(log.kinds)}
        print(f"heisd-view: {bag}: {len(steps)} steps ({kinds}) in "
              f"{time.perf_counter() - t0:.2f} s" + (f" -> {save}" if save else ""))
        served = served or url is not None
    return served


def view_live(args) -> bool:
    """``live``: log the graph's steps until Ctrl-C or ``--duration-s``; True when served."""
    import rclpy

    from heisd_ros.tools.graph.listener import GraphListener
    from heisd_ros.tools.view_live import LiveView
    from heisd_ros.viewer.episode_log import EpisodeLog
    from heisd_ros.viewer.output import open_recording

    recording, url = open_recording(_output(args, args.save), "live graph")
    view = LiveView(EpisodeLog(recording, path_keep=args.path_steps), args.gripper_joint)
    context = rclpy.Context()
    rclpy.init(context=context)
    listener = GraphListener.on_own_thread(context, "heisd_view", cameras=True,
                                           robot_state=True, episodes=True, keep=1,
                                           tap=view.tap)
    end = None if args.duration_s is None else time.monotonic() + args.duration_s
    try:
        while end is None or time.monotonic() < end:
            view.pump()
            time.sleep(0.05)   # a viewer's refresh period, not a synchronisation
    except KeyboardInterrupt:
        pass
    finally:
        view.pump()
        listener.close()
        rclpy.shutdown(context=context)
        recording.flush()
    print(f"heisd-view: {view.log.steps} steps of {view.episodes} episodes"
          + (f", not logged: {view.skipped}" if view.skipped else ""))
    return url is not None


def view_file(args) -> bool:
    """``open``: a saved recording, in the web or the native viewer; True when served."""
    from heisd_ros.viewer import require_rerun
    from heisd_ros.viewer.output import open_recording

    path = Path(args.file)
    if not path.is_file():
        raise ValueError(f"{path}: no such recording")
    recording, url = open_recording(_output(args), path.stem)
    require_rerun().log_file_from_path(path, recording=recording)
    recording.flush()
    return url is not None


def _serve(args) -> None:
    """Keep the web viewer's servers (threads of this process) up until Ctrl-C or --serve-s."""
    print("heisd-view: serving; Ctrl-C stops", file=sys.stderr)
    end = None if args.serve_s is None else time.monotonic() + args.serve_s
    try:
        while end is None or time.monotonic() < end:
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass


def main(argv=None) -> int:
    """Entry point."""
    from heisd_ros.viewer import RerunMissing

    args = build_parser().parse_args(argv)
    try:
        view = {"live": view_live, "bag": view_bags, "open": view_file}[args.source]
        served = view(args)
    except RerunMissing as err:
        print(f"heisd-view: {err}", file=sys.stderr)
        return 2
    except ValueError as err:   # bad input: a bag that is no episode, a missing file
        print(f"heisd-view: {err}", file=sys.stderr)
        return 2
    if served:
        _serve(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
