r"""heisd-calibrate: verify-skip and router thresholds from held-out demonstrations.

Reads the DB and ``offline_stats.json`` written by ``heisd-build-db`` (held-out episodes,
router statistics per suite), runs the target once per held-out step (top-1 retrieval
draft verified in the prefill forward), and writes the calibration JSON the decoder loader
reads (``--calibration``, ``model.calibration_path``; checked against the model). See
``heisd_ros/calibration/verify_skip.py`` for the definitions.

Examples:
    heisd-calibrate --db runs/db --out runs/db/calibration.json
    heisd-calibrate --db runs/db --held-out data/demos_heldout --precision 0.98 \
        --max-steps 40 --target small_vla.safetensors
    heisd-calibrate --db runs/db_openvla --model openvla --checkpoint ckpt/openvla-7b-ft \
        --unnorm-key libero_spatial --center-crop    # the DB built with the same options
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    """Command line of ``heisd-calibrate``."""
    from heisd_ros.tools._common import add_model_arguments

    p = argparse.ArgumentParser(prog="heisd-calibrate", description=__doc__.split("\n")[0])
    p.add_argument("--db", required=True, help="DB directory (edge backend)")
    p.add_argument("--stats-dir", default=None, help="offline statistics (default: --db)")
    p.add_argument("--held-out", default=None, help="npz demo root to use instead of the "
                   "held-out episodes listed in offline_stats.json")
    p.add_argument("--target", default=None, help="small-VLA safetensors (as for build-db)")
    add_model_arguments(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--precision", type=float, default=0.95)
    p.add_argument("--min-support", type=int, default=10)
    p.add_argument("--max-steps", type=int, default=0, help="steps per episode (0 = all)")
    p.add_argument("--exact", action="store_true", help="exact search (small DBs, tests)")
    p.add_argument("--out", default=None, help="calibration JSON (default: <db>/calibration.json)")
    p.add_argument("--threads", type=int, default=None)
    return p.parse_args(argv)


def run(args) -> dict:
    """Collect held-out samples and write the calibration; returns it as a dict."""
    from heisd_ros.calibration.verify_skip import CalibrationConfig, calibrate, collect_samples
    from heisd_ros.data.npz_episodes import iter_episode_paths
    from heisd_ros.kinematics.router import (
        KinematicRouter,
        RouterConfig,
        RouterStats,
        router_stats_file,
    )
    from heisd_ros.retrieval.embedding import model_fingerprint
    from heisd_ros.retrieval.retriever import Retriever, RetrieverConfig
    from heisd_ros.retrieval.store import open_store
    from heisd_ros.retrieval.store_config import StoreConfig
    from heisd_ros.tools._common import (
        episode_loader,
        load_target_from_args,
        recorded_episodes,
    )

    stats_dir = Path(args.stats_dir or args.db)
    offline = json.loads((stats_dir / "offline_stats.json").read_text(encoding="utf-8"))
    paths = (iter_episode_paths(args.held_out) if args.held_out
             else recorded_episodes(offline, "held_out_episodes", "--held-out"))
    if not paths:
        raise ValueError("held-out: no held-out episodes (build the DB with --hold-out-every "
                         "> 0, or pass --held-out)")
    load = episode_loader(offline)
    target, description = load_target_from_args(args)
    fingerprint = model_fingerprint(target)
    config = CalibrationConfig(precision=args.precision, min_support=args.min_support)
    store = open_store(StoreConfig(path=args.db, exact_search=args.exact),
                       model_fingerprint=fingerprint)
    try:
        retriever = Retriever(store, RetrieverConfig(k=1, demote_steps=0))
        samples = {}
        for path in paths:
            record = load(path)
            # The DB's own file, where every front end looks (the path the build recorded is
            # relative to where it ran, and stale once the DB is copied or moved).
            stats_file = router_stats_file(stats_dir, record.suite)
            router = None
            if stats_file.is_file():
                stats = RouterStats.load(stats_file)
                router = KinematicRouter(RouterConfig(window=stats.window), stats)
            one = collect_samples(target, retriever, [record], router, args.max_steps, config)
            for key, value in one.items():
                samples.setdefault(key, []).append(value)
    finally:
        store.close()
    import numpy as np

    merged = {k: np.concatenate(v) for k, v in samples.items()}
    calibration = calibrate(merged, config, fingerprint)
    out = Path(args.out or Path(args.db) / "calibration.json")
    calibration.save(out)
    return {"target": description, "out": str(out),
            **json.loads(out.read_text(encoding="utf-8"))}


def main(argv=None) -> int:
    """Entry point of ``heisd-calibrate``."""
    from heisd_ros.retrieval.errors import StoreError
    from heisd_ros.tools._common import set_threads

    args = parse_args(argv)
    set_threads(args.threads)
    try:
        result = run(args)
    except (ValueError, StoreError, FileNotFoundError) as exc:
        print(f"heisd-calibrate: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
