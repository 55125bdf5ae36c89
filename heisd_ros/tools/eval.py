r"""heisd-eval: closed-loop comparison of decoding methods on the simulated task suites.

For each suite (and each of its tasks) every method runs the same seeded episodes, methods
interleaved per episode. Reports SR with 95% Wilson intervals, wall-clock speed-up vs AR
measured in the same run, AL, target forwards per action, skip rate, router share, p50/p99
step latency, the stage breakdown and the projection to OpenVLA-7B on a GPU.

Examples:
    heisd-eval --suites piper_goal --episodes 20 --methods ar heisd --report runs/eval
    heisd-eval --suites piper_spatial piper_object piper_goal piper_long --episodes 20 \
        --methods ar drafter drafter_relaxed retrieval router_only router_skip heisd \
        --drafter runs/drafter/draft_head.safetensors --json runs/eval/eval.json
    # interrupted? the same command with --resume runs only the tasks not finished yet
    heisd-eval --suites piper_goal --tasks red_block_on_plate --episodes 1 --max-steps 5
    heisd-eval --suites piper_goal --episodes 5 --methods ar heisd --db db_openvla \
        --model openvla --checkpoint ckpt/openvla-7b-ft --unnorm-key KEY \
        --drafter runs/drafter_openvla/draft_head.safetensors    # on a GPU
    # the world moves while a method decides, so its latency costs world time; time scale 2
    # runs the world twice as fast, as for methods twice as slow as on this machine
    heisd-eval --suites piper_goal --episodes 5 --methods ar heisd --real-time --time-scale 2

Needs MUJOCO_GL=egl (or glfw/osmesa) for rendering.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    """Command-line options."""
    from heisd_ros.decoding.methods import METHOD_NAMES
    from heisd_ros.tools._common import add_decoder_arguments

    p = argparse.ArgumentParser(prog="heisd-eval", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suites", nargs="+", default=None,
                   help="suite names (required unless --curve)")
    p.add_argument("--tasks", nargs="*", default=[], help="only these tasks (default all)")
    p.add_argument("--methods", nargs="+", default=["ar", "drafter"],
                   help=f"from {list(METHOD_NAMES)} (AR always runs: it is the reference)")
    p.add_argument("--episodes", type=int, default=20, help="episodes per task and method")
    p.add_argument("--seed", type=int, default=0, help="seed of the first episode")
    p.add_argument("--max-steps", type=int, default=None, help="default: each task's limit")
    p.add_argument("--image-size", type=int, default=224, help="camera width = height, px")
    p.add_argument("--real-time", action="store_true",
                   help="the world moves while a method decides: a decision starts on a camera "
                        "frame, its action lands after the method's latency, and the episode "
                        "gets --max-steps control periods of world time (default: lockstep, "
                        "the world waits)")
    p.add_argument("--time-scale", type=float, default=None,
                   help="with --real-time: world seconds per wall second of a decision "
                        "(default 1.0; 2 emulates methods twice as slow)")
    p.add_argument("--camera-rate-hz", type=float, default=None,
                   help="with --real-time: camera frame rate decisions start on (default 30)")
    p.add_argument("--no-pace", dest="pace", action="store_false", default=None,
                   help="with --real-time: start each decision at once instead of at its "
                        "frame's time on the wall clock (shorter; but a check behind then "
                        "gets no wall time between decisions)")
    add_decoder_arguments(p, closed_loop=True)
    p.add_argument("--latency-profile", default=None, metavar="PROFILE",
                   help="with --real-time: a decision's latency is its counters priced by this "
                        "profile (a shipped name such as openvla-7b-paper, a YAML file from "
                        "heisd-bench decode --latency-profile-out, or fixed:<ms>), not the wall "
                        "clock: deterministic, unpaced, every worker the machine has; the "
                        "retrieval deadline is then off unless given (retrieval is priced). Also "
                        "the projection's profile (default openvla-7b-paper)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--workers", type=int, default=1,
                   help="processes sharing the tasks (each loads the models; give each "
                        "--threads 1 and keep workers x threads <= CPU cores)")
    p.add_argument("--json", default=None,
                   help="write the results here; every finished task is kept in JSON.parts/ "
                        "until then")
    p.add_argument("--resume", action="store_true",
                   help="reuse the tasks an interrupted run with the same --json, options, "
                        "code and input files finished; run only the rest")
    p.add_argument("--report", default=None, help="write report.md and PNG plots here")
    p.add_argument("--view", default=None, metavar="DIR",
                   help="write every episode as a Rerun recording, "
                        "DIR/<suite>/<task>/<method>_seed<seed>.rrd (open: heisd-view open FILE)")
    p.add_argument("--curve", nargs="+", default=None, metavar="RUN_JSON",
                   help="no evaluation: success against speed over these earlier runs' "
                        "--json files, which differ in --curve-key (a table; with --report "
                        "also curve.md and curve.png)")
    p.add_argument("--curve-key", default="max_unverified_run",
                   help="the config setting the --curve runs differ in")
    p.add_argument("--latency-profile-out", default=None, metavar="FILE",
                   help="fit a latency profile (YAML) to the stage times of this run's decisions "
                        "(closed loop, as the robot computer runs them; heisd-bench decode "
                        "--latency-profile-out fits on the decoder alone)")
    p.add_argument("--sweep", nargs="+", default=None, metavar="RUN_JSON",
                   help="no evaluation: success, world time to success and late share against "
                        "decision latency over these earlier --real-time runs' --json files "
                        "(one per --latency-profile; with --report also sweep.md and sweep.png)")
    return p


def curve(args) -> int:
    """``--curve``: the table (and plot) of earlier runs; exit 2 on unreadable ones."""
    from heisd_ros.eval import curve as curves
    from heisd_ros.eval import report

    try:
        points = curves.curve_points(curves.load_runs(args.curve), args.curve_key)
    except ValueError as err:
        print(f"heisd-eval: {err}", file=sys.stderr)
        return 2
    table = curves.curve_table(points, args.curve_key)
    print(report.format_table(*table))
    if args.report:
        png = curves.plot_curve(Path(args.report) / "curve.png", points, args.curve_key)
        md = report.write_markdown(
            Path(args.report) / "curve.md", f"Success against speed over {args.curve_key}",
            [("Runs", "\n".join(f"- {p}" for p in args.curve)),
             ("Table", report.markdown_table(*table))], [png])
        print(f"report: {md}")
    return 0


def sweep(args) -> int:
    """``--sweep``: the latency sweep's table (and plot) of earlier runs; exit 2 on bad runs."""
    from heisd_ros.eval import report
    from heisd_ros.eval import sweep as sweeps

    try:
        points = sweeps.sweep_points(sweeps.load_runs(args.sweep, "--sweep"))
    except ValueError as err:
        print(f"heisd-eval: {err}", file=sys.stderr)
        return 2
    table = sweeps.sweep_table(points)
    print(report.format_table(*table))
    if args.report:
        png = sweeps.plot_sweep(Path(args.report) / "sweep.png", points)
        md = report.write_markdown(
            Path(args.report) / "sweep.md", "Success against decision latency",
            [("Runs", "\n".join(f"- {p}" for p in args.sweep)),
             ("Table", report.markdown_table(*table))], [png])
        print(f"report: {md}")
    return 0


def _tasks(suites, only) -> list[tuple[str, str]]:
    from heisd_ros.sim.suites import list_tasks

    pairs = [(s, t) for s in suites for t in list_tasks(s) if not only or t in only]
    unknown = sorted(set(only) - {t for _, t in pairs})
    if unknown:
        raise ValueError(f"--tasks: {unknown} are not in suites {list(suites)}")
    return pairs


def run(args):
    """Evaluate; returns (result JSON, episode runs)."""
    from tqdm import tqdm

    from heisd_ros.decoding.retrieval_accept import GroupAcceptConfig
    from heisd_ros.decoding.retrieval_source import RetrievalSourceConfig
    from heisd_ros.decoding.retrieval_tree import GroupTreeConfig
    from heisd_ros.decoding.unverified import UnverifiedConfig
    from heisd_ros.eval.closed_loop import summarise_by_suite
    from heisd_ros.eval.job_results import JobResults
    from heisd_ros.eval.methods import check_methods
    from heisd_ros.eval.projection import DEFAULT_PROFILE, project
    from heisd_ros.latency.fit import prediction as predict
    from heisd_ros.latency.profile import load_profile

    methods = check_methods(args.methods)
    tasks = _tasks(args.suites, args.tasks)
    if args.workers < 1:
        raise ValueError(f"--workers: expected >= 1, got {args.workers}")
    if args.resume and not args.json:
        raise ValueError("--resume needs --json: a run keeps its finished tasks next to it")
    timing = _timing(args)
    if timing.get("latency_profile") and args.retrieval_deadline_ms is None:
        # Priced, not timed: retrieval costs the profile's retrieval_ms, and a wall-clock
        # deadline would make the run depend on this machine's load.
        args.retrieval_deadline_ms = 0.0
    jobs = _jobs(tasks, args.max_steps)
    store = JobResults(args.json, _fingerprint(args, methods, tasks)) if args.json else None
    if store is not None and not args.resume:
        store.clear()
    runs, desc, todo = [], None, []
    for name, pairs in jobs:
        done = store.load(name) if args.resume else None
        if done is None:
            if args.resume:
                _check_kept_timing(store, name, timing)
            todo.append((name, pairs))
        else:
            runs += done[0]
            desc = desc or done[1]
    if args.resume:
        print(f"heisd-eval: resuming: {len(jobs) - len(todo)} of {len(jobs)} tasks done already "
              f"({store.folder}), {len(todo)} to run", file=sys.stderr)
    workers = min(args.workers, len(jobs))

    def job_done(name: str, job_runs: list, job_desc: dict) -> None:
        nonlocal desc
        runs.extend(job_runs)
        desc = desc or job_desc
        if store is not None:   # the timing is kept with the part: --resume checks it
            store.save(name, job_runs, {**job_desc, "timing": timing})

    # every finished episode moves the bar (a task of 5 methods x 20 episodes takes minutes)
    with tqdm(total=len(tasks) * args.episodes * len(methods), initial=len(runs),
              unit="episode", file=sys.stderr, mininterval=0, miniters=1) as bar:

        def finished(task: str, method: str) -> None:
            bar.set_postfix(task=task, method=method, refresh=False)
            bar.update(1)

        _run_jobs(args, methods, todo, workers, finished, job_done)
        bar.update(len(runs) - bar.n)  # reports still in flight when the last job ended
    order = {pair: i for i, pair in enumerate(tasks)}
    runs.sort(key=lambda r: (order[(r.suite, r.task)], r.seed, methods.index(r.method)))
    suites = summarise_by_suite(runs)
    config = {"suites": list(args.suites), "tasks": [f"{s}/{t}" for s, t in tasks],
              "methods": methods, "episodes_per_task": args.episodes, "seed": args.seed,
              "max_steps": args.max_steps, "image_size_px": args.image_size,
              "threads": _threads(), "workers": workers,
              "retrieval_tree_nodes": args.retrieval_tree_nodes or GroupTreeConfig().node_budget,
              "skip_threshold": args.skip_threshold,
              "router_threshold": args.router_threshold,
              "max_unverified_run": args.max_unverified_run,
              "follow_min_similarity": (args.follow_min_similarity
                                        if args.follow_min_similarity is not None
                                        else UnverifiedConfig().follow_min_similarity),
              "router_min_points": args.router_min_points or 0,
              "accept_token_max_bins": (args.accept_token_max_bins
                                        if args.accept_token_max_bins is not None
                                        else GroupAcceptConfig().token_max_bins),
              "accept_group_sum_max_bins": (args.accept_group_sum_max_bins
                                            if args.accept_group_sum_max_bins is not None
                                            else GroupAcceptConfig().group_sum_max_bins),
              "retrieval_deadline_ms": (args.retrieval_deadline_ms
                                        if args.retrieval_deadline_ms is not None
                                        else RetrievalSourceConfig().deadline_s * 1e3)}
    if timing["mode"] == "real_time":   # a lockstep config (and report) stays as it was
        config.update(real_time=True, time_scale=timing["time_scale"],
                      camera_rate_hz=timing["camera_rate_hz"], pace=timing.get("pace", True))
        if timing.get("latency_profile"):
            config["latency_profile"] = timing["latency_profile"]["name"]
    desc = {k: v for k, v in desc.items() if k != "timing"}
    steps = {m: [s for r in runs if r.method == m for s in r.steps] for m in methods}
    profile = load_profile(args.latency_profile or DEFAULT_PROFILE)
    # With --latency-profile: the profile's prediction of what was measured here.
    prediction = predict(steps, profile) if args.latency_profile else None
    fitted = _fit_profile(args, steps) if args.latency_profile_out else None
    result = {"profile_prediction": prediction, "latency_profile_fit": fitted, **desc,
              "timing": timing, "config": config, "suites": suites,
              "projection": project(steps, profile),
              "episodes": [_episode_entry(r) for r in runs]}
    return result, runs


def _fit_profile(args, steps: dict[str, list[dict]]) -> dict:
    """``--latency-profile-out``: fit a profile to the run's measured decisions and write it."""
    import platform

    import torch

    from heisd_ros.latency.fit import fit_and_save

    out = Path(args.latency_profile_out)
    machine = (f"{platform.processor() or platform.machine()} CPU, {_threads()} threads, "
               f"{args.workers} worker(s), torch {torch.__version__}")
    return fit_and_save(steps, out, name=out.stem, description=f"closed loop on {machine}",
                        check_occupies="core", command="heisd-eval " + " ".join(sys.argv[1:]),
                        machine=machine)


def _episode_entry(run) -> dict:
    """One episode in the result JSON (real-time ones with their world time and commands)."""
    entry = {"suite": run.suite, "task": run.task, "seed": run.seed, "method": run.method,
             "success": run.success, "steps": len(run.steps), "progress": run.progress}
    if run.world_time_s is not None:
        entry.update(world_time_s=run.world_time_s, commands=run.commands)
    return entry


def _timing(args) -> dict:
    """How the world's time runs: {"mode": "lockstep"} or real time with its settings.

    Raises:
        ValueError: --time-scale or --camera-rate-hz without --real-time, or a bad value.
    """
    if not args.real_time:
        for option, value in (("--time-scale", args.time_scale),
                              ("--camera-rate-hz", args.camera_rate_hz),
                              ("--no-pace", args.pace)):
            if value is not None:
                raise ValueError(f"{option}: only with --real-time (lockstep episodes wait "
                                 f"for the method)")
        return {"mode": "lockstep"}
    from heisd_ros.sim.runner import RealTime

    values = {"time_scale": 1.0 if args.time_scale is None else args.time_scale,
              "camera_rate_hz": 30.0 if args.camera_rate_hz is None else args.camera_rate_hz}
    try:
        RealTime(**values)
    except ValueError as err:
        option = "--" + str(err).split(":", 1)[0].replace("_", "-")
        raise ValueError(f"{option}: {err}") from err
    if args.latency_profile is None:
        return {"mode": "real_time", **values, "pace": args.pace is not False}
    from heisd_ros.latency.profile import load_profile

    if args.pace is not None:
        raise ValueError("--no-pace: a run at --latency-profile is never paced (its latency "
                         "is priced, not timed)")
    profile = load_profile(args.latency_profile)
    return {"mode": "real_time", **values, "pace": False, "latency_profile": profile.to_dict()}


def _realtime(args):
    """The ``RealTime`` of the episodes, or None for lockstep."""
    from heisd_ros.sim.runner import RealTime

    timing = _timing(args)
    if timing["mode"] == "lockstep":
        return None
    profile = timing.get("latency_profile")
    if profile is not None:
        from heisd_ros.latency.profile import LatencyProfile

        profile = LatencyProfile.from_dict(profile)
    return RealTime(time_scale=timing["time_scale"], camera_rate_hz=timing["camera_rate_hz"],
                    pace=timing.get("pace", True), profile=profile)


def _describe_timing(timing: dict) -> str:
    if timing.get("mode") == "real_time":
        pace = "" if timing.get("pace", True) else ", --no-pace"
        if timing.get("latency_profile"):
            pace = f", --latency-profile {timing['latency_profile']['name']}"
        return (f"in real time (--time-scale {timing['time_scale']}, --camera-rate-hz "
                f"{timing['camera_rate_hz']}{pace})")
    return "in lockstep"


def _check_kept_timing(store, job: str, timing: dict) -> None:
    """Refuse to resume next to a kept task that ran with other timing options.

    Such a part would never be reused (its fingerprint differs), so the run would silently
    start over; the mismatch is more likely a forgotten option.
    """
    import gzip
    import json

    try:
        with gzip.open(store.path(job), "rt") as f:
            kept = (json.load(f).get("desc") or {}).get("timing")
    except (OSError, EOFError, ValueError):
        return  # no part, or cut short: nothing to compare
    if kept is not None and kept != timing:
        raise ValueError(f"--resume: the tasks kept in {store.folder} ran "
                         f"{_describe_timing(kept)}, this run is {_describe_timing(timing)}; "
                         f"resume with the same options, or run without --resume to start over")


def _run_jobs(args, methods, jobs, workers: int, finished, job_done) -> None:
    """Run ``jobs`` ((name, pairs) each) in this process or in ``workers`` processes.

    ``finished(task, method)`` after every episode, ``job_done(name, runs, desc)`` after every
    job, both called in this process.
    """
    workers = min(workers, len(jobs))
    if workers <= 1:
        for name, pairs in jobs:
            job_done(name, *_run_tasks(args, methods, pairs, finished))
        return
    # Every job interleaves the methods itself, so speed-ups stay ratios measured side by side
    # in one process.
    import multiprocessing

    spawn = multiprocessing.get_context("spawn")   # no fork after EGL/torch init
    episodes = spawn.Queue()  # (task, method) of each finished episode, from the workers
    # Leaving the block (the jobs done, an error, Ctrl-C, SIGTERM) terminates the workers.
    with spawn.Pool(workers, initializer=_init_worker, initargs=(episodes, os.getpid())) as pool:
        pending = {pool.apply_async(_worker, ((args, methods, pairs),)): name
                   for name, pairs in jobs}
        while pending:
            _drain(episodes, finished, timeout_s=0.5)
            for job in [job for job in pending if job.ready()]:
                job_done(pending.pop(job), *job.get())  # a worker's error is raised here


def _run_tasks(args, methods, tasks, finished=None):
    """Episodes of ``tasks`` (suite, task pairs) for every method; returns (runs, model info).

    ``finished(task, method)`` is called after every episode.
    """
    from heisd_ros.eval.closed_loop import run_interleaved_episodes
    from heisd_ros.eval.methods import build_method, context_from_args
    from heisd_ros.sim.config import SimConfig

    sim_config = SimConfig(image_width_px=args.image_size, image_height_px=args.image_size)
    realtime = _realtime(args)
    ctx, desc = context_from_args(args, methods, warn=_warn, closed_loop=True)

    def progress(suite, task, seed, method, success):
        if finished is not None:
            finished(task, method)

    ctx.tasks = tuple(dict.fromkeys(task for _, task in tasks))
    runs = []
    try:
        for suite in dict.fromkeys(s for s, _ in tasks):
            # Router statistics are per suite, so the decoders are built per suite.
            ctx.use_suite(suite)
            decoders = {m: build_method(m, ctx) for m in methods}
            if realtime is not None and realtime.profile is not None:
                price_paths(decoders.values(), realtime.profile)
            runs += run_interleaved_episodes(decoders, [p for p in tasks if p[0] == suite],
                                             args.episodes, args.seed, args.max_steps,
                                             sim_config, progress, realtime=realtime,
                                             view_dir=args.view)
    finally:
        ctx.close()
    return runs, desc


def price_paths(decoders, profile) -> None:
    """Decoders that choose between exact decode paths by cost choose by ``profile``'s prices.

    Their choice then does not depend on this machine's load, so a run at a latency profile
    repeats exactly (``Decoder.path_pricing``; decoders without such a choice ignore it).
    """
    from functools import partial

    from heisd_ros.latency.pricing import work_ms

    for decoder in decoders:
        decoder.path_pricing = partial(work_ms, profile)


def _jobs(tasks, max_steps: int | None) -> list[tuple[str, list[tuple[str, str]]]]:
    """(task name, its (suite, task) pairs) per job, the longest first.

    A name in two suites (one DB collection) runs in one process. Longest first by step limit:
    the last jobs running alone are then short ones, so fewer workers sit idle at the end.
    """
    from heisd_ros.sim.suites import get_task

    by_name: dict[str, list[tuple[str, str]]] = {}
    for suite, task in tasks:
        by_name.setdefault(task, []).append((suite, task))

    def steps(pairs) -> int:
        return sum(max_steps or get_task(suite, task).max_steps for suite, task in pairs)

    return sorted(by_name.items(), key=lambda job: -steps(job[1]))


def _fingerprint(args, methods, tasks) -> str:
    """What a resumed run must share with the one it resumes (see ``eval.job_results``)."""
    from heisd_ros.eval.job_results import run_fingerprint

    skip = {"json", "report", "resume", "workers", "curve", "curve_key", "suites", "tasks",
            "methods", "real_time", "time_scale", "camera_rate_hz", "view"}
    options = {k: v for k, v in vars(args).items() if k not in skip}
    options.update(methods=methods, tasks=tasks, timing=_timing(args))
    files = [getattr(args, k, None) for k in ("target", "drafter", "calibration", "router_stats",
                                               "vision_specs", "checkpoint")]
    return run_fingerprint(options, files)


_episodes_queue = None  # in a ``--workers`` process: where finished episodes are reported


def _init_worker(episodes, parent_pid: int) -> None:
    global _episodes_queue
    _episodes_queue = episodes
    # Ctrl-C reaches the whole process group: the parent alone handles it, and stops us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_with_parent(parent_pid)


def _exit_with_parent(parent_pid: int, period_s: float = 0.5) -> None:
    """Exit this worker once its parent is gone, killed even by SIGKILL.

    An orphaned worker would go on for hours holding its embedded DB shards, and the next run
    on that DB would find them locked.
    """

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(period_s)
        os._exit(1)

    threading.Thread(target=watch, name="heisd-eval-parent-watch", daemon=True).start()


def _worker(job):
    """One ``--workers`` process: its share of the tasks, each episode reported as it ends."""
    from heisd_ros.tools._common import set_threads

    args, methods, tasks = job
    set_threads(args.threads)
    return _run_tasks(args, methods, tasks, lambda *episode: _episodes_queue.put(episode))


def _drain(episodes, finished, timeout_s: float) -> None:
    """Pass on the episodes reported so far, waiting up to ``timeout_s`` for the first."""
    import queue

    try:
        finished(*episodes.get(timeout=timeout_s))
        while True:
            finished(*episodes.get_nowait())
    except queue.Empty:
        return


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def _kept_message(store) -> str:
    """What an interrupted run leaves behind for ``--resume``."""
    saved = store.saved()
    if not saved:
        return "; no task had finished (a task is kept once all its episodes end)"
    return (f"; {len(saved)} finished task(s) are kept in {store.folder}: the same command "
            f"with --resume runs the others")


def _warn(message: str) -> None:
    """A warning about the models in use (an untrained draft head), on stderr."""
    print(f"heisd-eval: WARNING: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``heisd-eval``; exit 2 on bad options."""
    args = build_parser().parse_args(argv)
    if args.curve:
        return curve(args)
    if args.sweep:
        return sweep(args)
    if not args.suites:
        print("heisd-eval: --suites is required (or --curve / --sweep RUN_JSON ...)",
              file=sys.stderr)
        return 2
    if args.view:   # before any episode, not after the first one
        from heisd_ros.viewer import RerunMissing, require_rerun

        try:
            require_rerun()
        except RerunMissing as err:
            print(f"heisd-eval: --view: {err}", file=sys.stderr)
            return 2
    from heisd_ros.eval import report
    from heisd_ros.eval.closed_loop import table_rows, write_eval_report
    from heisd_ros.eval.job_results import JobResults
    from heisd_ros.tools._common import set_threads, sigterm_as_interrupt

    set_threads(args.threads)
    try:
        with sigterm_as_interrupt():  # the workers are stopped on either signal
            result, runs = run(args)
    except ValueError as err:
        print(f"heisd-eval: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:
        kept = _kept_message(JobResults(args.json, "")) if args.json else ""
        print(f"heisd-eval: stopped by {str(stop) or 'Ctrl-C'}{kept}", file=sys.stderr)
        return 128 + (signal.SIGTERM if str(stop) == "SIGTERM" else signal.SIGINT)
    for suite, summary in result["suites"].items():
        if suite == "all" and len(result["suites"]) == 2:
            continue  # one suite: "all" is the same table
        print(f"\n{suite}:")
        print(report.format_table(*table_rows(summary)))
    print("\n" + result["projection"]["label"] + ": " + ", ".join(
        f"{n} " + ("-" if r["projected_speedup_vs_ar"] is None
                   else f"{r['projected_speedup_vs_ar']:.2f}x")
        for n, r in result["projection"]["methods"].items()))
    if result["profile_prediction"]:
        print(f"profile {result['projection']['profile']}: predicted / measured mean ms per "
              "action here: " + ", ".join(
                  f"{n} {p['predicted_with_waits_ms']:.1f} / {p['measured_ms']:.1f} "
                  f"({p['error']:+.1%})" for n, p in result["profile_prediction"].items()))
    if args.report:
        result["report_files"] = write_eval_report(args.report, result, runs)
        print(f"report: {result['report_files']['markdown']}")
    if args.json:
        report.write_json(args.json, result)
        JobResults(args.json, "").clear()  # the finished tasks are in the results now
    return 0


if __name__ == "__main__":
    sys.exit(main())
