r"""heisd-build-db: build the retrieval DB from demonstrations with the target VLA's embeddings.

Every step of every demonstration becomes one point: embedding = the target's pooled vision
features of both cameras (concatenated, L2-normalised), payload = the action's bins (the
target's codec) and values, the next 3 actions, task, episode, step, EE position. One
collection per task. Also written, next to the DB (``--stats-dir``, default the DB path):
``offline_stats.json`` (dimension, fingerprint, held-out episodes, router statistics per
suite) and ``router_stats_<suite>.json`` for the hybrid decoder.

An existing DB built with another model (fingerprint) or dimension is refused with a clear
message (exit code 2); rebuild into a new path.

``--demos`` is an npz root (``<suite>/<task>/episode_*.npz``, from heisd-collect) or rosbag2
recordings (MCAP or sqlite3): one bag directory, or a root holding bags, as ``heisd-record``,
``heisd-collect --format mcap`` or ``ros2 bag record`` of the robot's topics write them. Bag
steps are the EE commands paired with the camera frames, joint state and EE pose of the
observation they were decided on (by header stamp); topics are remapped with ``--topic-*``.
A bag without heisd custom data needs ``--bag-task`` (and ``--bag-instruction``,
``--bag-suite``). ``--demos-format auto`` reads npz files when the root has any, else bags.

Examples:
    heisd-build-db --demos data/demos_128 --db runs/db
    heisd-build-db --demos runs/bags --db runs/db_bags
    heisd-build-db --demos rosbag2_2026_03_01-10_00_00 --bag-task open_drawer \
        --bag-instruction "open the drawer" --topic-primary /cam_high/image_raw --db runs/db
    heisd-build-db --demos data/demos_128 --db runs/db --tasks open_drawer \
        --target small_vla.safetensors --hold-out-every 5
    heisd-build-db --demos demos --backend qdrant --url http://db:6333 --stats-dir runs/db
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    """Command line of ``heisd-build-db``."""
    from heisd_ros.tools._common import add_model_arguments

    p = argparse.ArgumentParser(prog="heisd-build-db", description=__doc__.split("\n")[0])
    p.add_argument("--demos", required=True, help="npz demonstration root (<suite>/<task>/), "
                   "a rosbag2 directory, or a root holding rosbag2 directories")
    p.add_argument("--demos-format", choices=("auto", "npz", "bag"), default="auto",
                   help="auto: npz when the root holds any, else rosbag2")
    _add_bag_arguments(p)
    p.add_argument("--db", default="", help="DB directory (edge, or qdrant local mode)")
    p.add_argument("--backend", default="edge", help="edge | qdrant")
    p.add_argument("--url", default="", help="Qdrant server URL (qdrant backend)")
    p.add_argument("--stats-dir", default=None, help="where the offline statistics go "
                   "(default: --db)")
    p.add_argument("--target", default=None, help="small-VLA safetensors (default: shipped "
                   "weights if present, else a seeded random init)")
    add_model_arguments(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--suites", nargs="*", default=None)
    p.add_argument("--tasks", nargs="*", default=None)
    p.add_argument("--max-episodes", type=int, default=0, help="0 = all")
    p.add_argument("--hold-out-every", type=int, default=5, help="every n-th episode of a "
                   "task is kept out of the DB for heisd-calibrate (0 = none)")
    p.add_argument("--router-window", type=int, default=15)
    p.add_argument("--exact", action="store_true", help="exact search (small DBs, tests)")
    index = p.add_argument_group(
        "index (default: chosen by the DB's size, see retrieval.store_config.index_for_size; "
        "an option given here wins)")
    index.add_argument("--vector-datatype", choices=("float32", "float16"), default=None,
                       help="stored vector type; float16 halves the DB's memory")
    index.add_argument("--quantization", choices=("none", "int8"), default=None,
                       help="int8: the HNSW search scores scalar int8 copies of the vectors "
                       "(kept in RAM) and rescores its candidates with the stored ones")
    index.add_argument("--centering", choices=("off", "on"), default=None,
                       help="store centred unit vectors searched by Euclidean distance: the "
                       "cosine neighbours and scores, with int8 keeping its precision on "
                       "embeddings that all point one way")
    index.add_argument("--hnsw-m", type=int, default=None, help="HNSW edges per node")
    index.add_argument("--hnsw-ef-construct", type=int, default=None, help="HNSW build beam")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    return p.parse_args(argv)


def _add_bag_arguments(p: argparse.ArgumentParser) -> None:
    from heisd_ros.data.bag_episodes import EPISODE_OPTIONAL, EPISODE_ROLES
    from heisd_ros.data.bag_topics import add_topic_arguments

    bag = p.add_argument_group("rosbag2 demonstrations")
    add_topic_arguments(bag, EPISODE_ROLES, optional=EPISODE_OPTIONAL, find_compressed=True)
    bag.add_argument("--max-skew-s", type=float, default=0.05,
                     help="largest header-stamp difference of paired messages, s")
    bag.add_argument("--gripper-joint", default="gripper",
                     help="JointState name of the gripper width (piper_ros: joint7)")
    bag.add_argument("--stop-on-bad-bag", action="store_true",
                     help="stop at the first bag that cannot be read (default: skip it, say "
                          "why, and list every skipped bag at the end)")
    bag.add_argument("--bag-task", default=None, help="task of bags without heisd.task "
                     "custom data (overrides it when given)")
    bag.add_argument("--bag-suite", default=None, help="suite of such bags (default 'default')")
    bag.add_argument("--bag-instruction", default=None,
                     help="instruction of such bags (default: the task)")


def _demo_source(args) -> tuple[list[Path], object, object]:
    """(episode paths, load(path) -> EpisodeRecord, task(path) -> str) of --demos."""
    from heisd_ros.data import bag_episodes, npz_episodes
    from heisd_ros.data.bag_topics import resolve_cameras, topic_options
    from heisd_ros.data.rosbag_io import metadata_topics

    root = Path(args.demos)
    fmt = args.demos_format
    if fmt == "auto":
        has_npz = root.is_dir() and not bag_episodes.is_bag(root) and any(
            npz_episodes.iter_episode_paths(root))
        fmt = "npz" if has_npz else "bag"
    if fmt == "npz":
        paths = npz_episodes.iter_episode_paths(root, args.suites, args.tasks)
        return paths, npz_episodes.load_episode, lambda path: path.parent.name
    options = topic_options(args, bag_episodes.EPISODE_ROLES)
    defaults = bag_episodes.EpisodeDefaults(args.bag_suite, args.bag_task, args.bag_instruction)
    if not root.exists():
        raise ValueError(f"--demos: {root} does not exist")
    skipped = None if args.stop_on_bad_bag else args.skipped_bags
    try:
        paths = bag_episodes.iter_bag_paths(root, args.suites, args.tasks, defaults, skipped)
    except bag_episodes.BagEpisodeError as err:
        if args.demos_format != "auto":
            raise
        raise ValueError(f"--demos: no npz episodes (<suite>/<task>/episode_*.npz) and no "
                         f"rosbag2 directory: {err}") from err

    def load(path):
        # an unset camera: its default topic, or the /compressed one when only that is there
        topics = bag_episodes.EpisodeTopics(**resolve_cameras(options, metadata_topics(path)))
        return bag_episodes.load_bag_episode(path, topics, defaults, args.max_skew_s,
                                             args.gripper_joint)

    def task_of(path):
        try:
            return bag_episodes.bag_identity(path, defaults)["task"]
        except bag_episodes.BagEpisodeError:
            return ""  # its load says why, when it is loaded

    return paths, load, task_of


def _bag_options(args) -> dict:
    """The bag reading options, so later tools can read the held-out bags alike."""
    from heisd_ros.data.bag_episodes import EPISODE_ROLES
    from heisd_ros.data.bag_topics import topic_options

    return {"topics": topic_options(args, EPISODE_ROLES), "gripper_joint": args.gripper_joint,
            "max_skew_s": args.max_skew_s, "suite": args.bag_suite, "task": args.bag_task,
            "instruction": args.bag_instruction}


def _store_config(args, points: int):
    """The store config: the index chosen by size, with the options given on top; and why."""
    from heisd_ros.retrieval.store_config import StoreConfig, index_for_size

    index, reason = index_for_size(points)
    given = {"vector_datatype": args.vector_datatype, "quantization": args.quantization,
             "centering": None if args.centering is None else args.centering == "on",
             "hnsw_m": args.hnsw_m, "hnsw_ef_construct": args.hnsw_ef_construct}
    overrides = {k: v for k, v in given.items() if v is not None}
    if overrides:
        reason += "; given on the command line: " + ", ".join(
            f"{k} {v}" for k, v in overrides.items())
    index.update(overrides)
    config = StoreConfig(backend=args.backend, path=args.db, url=args.url,
                         exact_search=args.exact, **index)
    return config, {**index, "reason": reason}


def _router_stats(records, window: int, stats_dir: Path) -> dict:
    """Fit and save RouterStats per suite from the demos' EE trajectories."""
    from heisd_ros.kinematics.router import RouterStats, router_stats_file

    by_suite: dict[str, list] = {}
    for record in records:
        by_suite.setdefault(record.suite, []).append(record.ee_position_m)
    out = {}
    for suite, trajectories in sorted(by_suite.items()):
        try:
            stats = RouterStats.fit(trajectories, window=window, suite=suite)
        except ValueError as exc:  # too few / too short demos for this window
            out[suite] = {"error": str(exc)}
            continue
        path = router_stats_file(stats_dir, suite)
        stats.save(path)
        out[suite] = {"path": str(path), "n_windows": stats.n_windows}
    return out


def _dropped(records) -> dict[str, int]:
    """The bag commands left out of the DB, by reason (over every episode read from a bag)."""
    total: dict[str, int] = {}
    for record in records:
        for reason, n in (record.metadata or {}).get("dropped_reasons", {}).items():
            total[reason] = total.get(reason, 0) + n
    return total


def _load_episodes(paths: list[Path], load_episode, args) -> list:
    """[(index, EpisodeRecord)] of ``paths``; bags that cannot be read are skipped, said why.

    With ``--stop-on-bad-bag`` the first such bag stops the build instead.
    """
    from heisd_ros.data.bag_episodes import BagEpisodeError

    episodes = []
    for i, path in enumerate(paths):
        try:
            episodes.append((i, load_episode(path)))
        except BagEpisodeError as err:
            if args.stop_on_bad_bag:
                raise
            args.skipped_bags.append((path, str(err)))
            print(f"heisd-build-db: skipping a bag: {err}", file=sys.stderr)
    if not episodes:
        reasons = "\n".join(f"  {p}: {r.splitlines()[0]}" for p, r in args.skipped_bags)
        raise ValueError(f"--demos: none of the {len(paths)} bags could be read:\n{reasons}")
    return episodes


def build(args) -> dict:
    """Build the DB and the offline statistics; returns the summary (raises on bad input)."""
    from tqdm import tqdm

    from heisd_ros.retrieval.embedding import (
        build_database,
        embed_observation,
        model_fingerprint,
        split_held_out,
        write_offline_stats,
    )
    from heisd_ros.retrieval.store import open_store
    from heisd_ros.tools._common import load_target_from_args

    args.skipped_bags = []  # (path, reason) of bags left out, filled as they are read
    paths, load_episode, task_of = _demo_source(args)
    if args.max_episodes:
        paths = paths[:args.max_episodes]
    if not paths:
        raise ValueError(f"--demos: no episodes (npz files or rosbag2 directories) under "
                         f"{args.demos} for the given filters")
    db_paths, held_out = split_held_out(paths, args.hold_out_every, task_of)
    if not db_paths:
        raise ValueError("--hold-out-every: every episode would be held out")
    target, description = load_target_from_args(args)
    episodes = _load_episodes(db_paths, load_episode, args)
    dimension = int(embed_observation(target, episodes[0][1].observation(0)).shape[0])
    fingerprint = model_fingerprint(target)
    total = sum(r.num_steps for _, r in episodes)
    config, index = _store_config(args, total)
    print(f"heisd-build-db: index: {index['reason']}", file=sys.stderr)
    store = open_store(config, create=True, dimension=dimension, model_fingerprint=fingerprint)
    try:
        with tqdm(total=total, unit="step", desc="embedding", file=sys.stderr) as bar:
            summary = build_database(target, episodes, store, target.codec, progress=bar.update)
    finally:
        store.close()
    stats_dir = Path(args.stats_dir or args.db)
    stats_dir.mkdir(parents=True, exist_ok=True)
    result = {"target": description, "model_fingerprint": fingerprint, "dimension": dimension,
              "points": summary.points, "episodes": summary.episodes,
              "tasks": list(summary.tasks),
              "shared_collections": {t: list(v) for t, v in summary.shared.items()},
              # absolute: heisd-calibrate and heisd-bench may run from any directory
              "db_episodes": [str(p.resolve()) for p in db_paths],
              "held_out_episodes": [str(p.resolve()) for p in held_out],
              "demos_format": "bag" if db_paths[0].is_dir() else "npz",
              "bag_options": _bag_options(args) if db_paths[0].is_dir() else None,
              "index": index,
              "skipped_bags": [{"bag": str(p), "reason": r} for p, r in args.skipped_bags],
              "dropped_commands": _dropped([r for _, r in episodes]),
              "router_window": args.router_window,
              "router_stats": _router_stats([r for _, r in episodes], args.router_window,
                                            stats_dir)}
    write_offline_stats(stats_dir / "offline_stats.json", result)
    return result


def main(argv=None) -> int:
    """Entry point of ``heisd-build-db``."""
    from heisd_ros.retrieval.errors import MetadataMismatchError
    from heisd_ros.tools._common import set_threads

    args = parse_args(argv)
    set_threads(args.threads)
    try:
        result = build(args)
    except MetadataMismatchError as exc:
        print(f"heisd-build-db: refusing to add to an incompatible DB: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"heisd-build-db: {exc}", file=sys.stderr)
        return 2
    if result["skipped_bags"]:
        print(f"heisd-build-db: {len(result['skipped_bags'])} bags skipped:", file=sys.stderr)
        for item in result["skipped_bags"]:
            print(f"  {item['bag']}: {item['reason'].splitlines()[0]}", file=sys.stderr)
    if result["dropped_commands"]:
        print("heisd-build-db: bag commands left out: " + "; ".join(
            f"{n} {reason}" for reason, n in result["dropped_commands"].items()),
            file=sys.stderr)
    print(f"{result['points']} points from {result['episodes']} episodes, "
          f"{len(result['tasks'])} tasks, dimension {result['dimension']}, "
          f"fingerprint {result['model_fingerprint']}")
    for task, suites in result["shared_collections"].items():
        print(f"heisd-build-db: note: suites {', '.join(suites)} each have a task named "
              f"{task!r}; their episodes share one collection, so retrieval for either can "
              f"return the other's steps (name the tasks apart to keep them separate)",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
