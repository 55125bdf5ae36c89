"""The main job on the embedded default (``make demo``).

Runs, on the simulated PIPER with the shipped small VLA and an embedded Qdrant Edge DB:

1. a self-check that the built interfaces cross real DDS;
2. demonstrations for one suite (``heisd-collect``), once;
3. the retrieval DB from them (``heisd-build-db``) and the verify-skip calibration
   (``heisd-calibrate``), once;
4. the closed-loop comparison AR vs HeiSD (``--ablation``: every method) with the table, a
   Markdown report with plots and a JSON file (``heisd-eval``);
5. one HeiSD episode recorded to a rosbag2 (``heisd-record``).

Steps whose outputs exist are skipped, so a second run only re-evaluates; a DB that no longer
fits the shipped model (built by an earlier release) is built again.

Examples:
    python -m heisd_ros.tools.demo
    python -m heisd_ros.tools.demo --episodes 5 --ablation --out runs/demo
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import sys
import time
from pathlib import Path

ASSETS = Path(__file__).resolve().parents[1] / "assets"


def _dds_self_check(timeout_s: float = 10.0) -> str:
    """Publish one EECommand and receive it over DDS; return a one-line result."""
    import rclpy
    from rclpy.executors import SingleThreadedExecutor

    from heisd_ros.msg import EECommand

    context = rclpy.Context()
    rclpy.init(context=context)
    try:
        node = rclpy.create_node("heisd_demo_self_check", context=context)
        got: list[EECommand] = []
        node.create_subscription(EECommand, "/heisd_demo/ee_command", got.append, 10)
        pub = node.create_publisher(EECommand, "/heisd_demo/ee_command", 10)
        executor = SingleThreadedExecutor(context=context)
        executor.add_node(node)
        sent = EECommand(step_index=1, gripper=EECommand.GRIPPER_CLOSED)
        sent.translation_m.x = 0.01
        deadline = time.monotonic() + timeout_s
        while not got and time.monotonic() < deadline:
            pub.publish(sent)
            executor.spin_once(timeout_sec=0.1)
        executor.shutdown()
        node.destroy_node()
        return "ok" if got and got[0] == sent else f"no message within {timeout_s} s"
    finally:
        rclpy.shutdown(context=context)


def _tool(name: str, argv: list[str]) -> None:
    """Run ``heisd-<name>`` in this process; raise SystemExit with its code on failure."""
    print(f"\n== heisd-{name} {' '.join(argv)}", flush=True)
    module = importlib.import_module(f"heisd_ros.tools.{name.replace('-', '_')}")
    code = module.main(argv)
    if code:
        raise SystemExit(f"heisd-{name} failed (exit {code}); see its message above")


def _stale_db_reason(db: Path) -> str | None:
    """Why the demo's DB at ``db`` cannot serve the shipped model, or None (fits or absent).

    A DB from an earlier demo run was built with the model shipped then; after an update of
    the weights (or of what the fingerprint covers) the store refuses it, and the demo builds
    it again rather than stopping.
    """
    if not (db / "heisd_db.json").exists():
        return None
    from heisd_ros.models.loading import load_target
    from heisd_ros.retrieval.embedding import model_fingerprint
    from heisd_ros.retrieval.errors import MetadataMismatchError
    from heisd_ros.retrieval.store import open_store
    from heisd_ros.retrieval.store_config import StoreConfig

    target, _ = load_target(None)
    try:
        open_store(StoreConfig(path=str(db)), model_fingerprint=model_fingerprint(target)).close()
    except MetadataMismatchError as exc:
        return str(exc).split(": ", 1)[-1]
    return None


def parse_args(argv=None) -> argparse.Namespace:
    """Command line of the demo."""
    p = argparse.ArgumentParser(prog="heisd-demo", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="runs/demo", help="output directory (reused across runs)")
    p.add_argument("--suite", default="piper_goal")
    p.add_argument("--demos-per-task", type=int, default=6)
    p.add_argument("--episodes", type=int, default=2, help="evaluation episodes per task")
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--ablation", action="store_true", help="evaluate every method")
    p.add_argument("--image-size", type=int, default=128)
    args = p.parse_args(argv)
    if args.demos_per_task < 3:
        p.error("--demos-per-task: at least 3 (every 3rd is held out for calibration)")
    return args


def main(argv=None) -> int:
    """Run the demo pipeline; exit 1 when a step fails."""
    args = parse_args(argv)
    t0 = time.perf_counter()
    out = Path(args.out)
    try:
        result = _dds_self_check()
    except ImportError as exc:
        result = f"ROS 2 or the built interfaces are missing ({exc}); run scripts/setup.sh"
    print(f"interfaces over DDS: {result}")
    if result != "ok":
        return 1
    demos, db = out / "demos", out / "db"
    model = ["--target", str(ASSETS / "small_vla.safetensors")] \
        if (ASSETS / "small_vla.safetensors").exists() else []
    drafter = ["--drafter", str(ASSETS / "draft_head.safetensors")] \
        if (ASSETS / "draft_head.safetensors").exists() else []
    try:
        if not (demos / "summary.json").exists():
            _tool("collect", ["--suites", args.suite, "--episodes", str(args.demos_per_task),
                              "--seed", "5000", "--out", str(demos), "--format", "npz",
                              "--image-size", str(args.image_size)])
        stale = _stale_db_reason(db)
        if stale:
            print(f"\nthe DB at {db} does not fit the shipped model ({stale}); rebuilding it")
            shutil.rmtree(db)
        if not (db / "heisd_db.json").exists():
            # Every 3rd demonstration stays out of the DB for heisd-calibrate.
            _tool("build-db", ["--demos", str(demos), "--db", str(db), "--hold-out-every", "3",
                               *model])
        if not (db / "calibration.json").exists():
            _tool("calibrate", ["--db", str(db), *model])
        steps = ["--max-steps", str(args.max_steps)] if args.max_steps else []
        if args.ablation:
            from heisd_ros.decoding.methods import METHOD_NAMES

            methods = list(METHOD_NAMES)  # every method of the table, heisd_ar included
        else:
            methods = ["ar", "heisd"]
        _tool("eval", ["--suites", args.suite, "--episodes", str(args.episodes), "--methods",
                       *methods, "--db", str(db), "--calibration", str(db / "calibration.json"),
                       "--image-size", str(args.image_size), "--json",
                       str(out / "eval.json"), "--report", str(out / "report"),
                       *model, *drafter, *steps])
        from heisd_ros.sim.suites import list_tasks

        _tool("record", ["--suite", args.suite, "--task", list_tasks(args.suite)[0],
                         "--policy", "heisd", "--episodes", "1", "--seed", "9000", "--overwrite",
                         "--out", str(out / "bags"), "--db", str(db), "--calibration",
                         str(db / "calibration.json"), "--image-size", str(args.image_size),
                         *model, *drafter, *steps])
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"\ndemo done in {time.perf_counter() - t0:.0f} s: report {out / 'report'}, "
          f"results {out / 'eval.json'}, bag {out / 'bags'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
