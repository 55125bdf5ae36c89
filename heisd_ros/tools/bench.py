r"""heisd-bench: measure decoding speed and fidelity side by side.

Subcommands:
    decode   methods of the method table (--methods; default ar, drafter and
             drafter_relaxed) on the same observations, interleaved, after warm-up; prints a
             table and writes --json. With --db also the hybrid methods (retrieval,
             router_only, router_skip, heisd) on demonstration steps.
    profile  the cost of each building block (vision, prefill, one decode forward, a tree
             forward, one draft-head forward) and the ratios the design relies on.
    retrieval  vector-store latency (median, p99; wall-clock and process CPU time) and
             recall@K against exact search per backend and size, on demonstration-shaped
             vectors (smooth per-task latent trajectories projected to the embedding
             dimension, plus noise) or, with --db, the embeddings of our own demonstrations
             (held-out demonstrations as queries); build time, reopen time, memory (RSS
             growth) and disk size. One collection holds all points (the worst case; the DB
             splits them per task).
    graph    the policy node in the running ROS graph (PIPER driver, cameras and robot state
             at a real robot's rates) vs the same decoder in one process: step time, command
             rate and age, held steps (heisd_ros/tools/graph/bench_cli.py).
    sim-graph  the launched sim graph while the world runs in real time: command rate, age
             and stalls, camera and robot-state rates over the running time of episodes
             (heisd_ros/tools/graph/sim_cli.py).
    soak     the real-time sim graph for long (--duration-min), in windows: command rate
             and age, held steps, RSS and CPU per process, episodes, tracebacks and exits,
             and a verdict (heisd_ros/tools/graph/soak.py).

Examples:
    heisd-bench decode --drafter runs/drafter/draft_head.safetensors --observations 64 \
        --seed 0 --json bench.json
    heisd-bench decode --target small_vla.safetensors \
        --drafter runs/drafter/draft_head.safetensors --relaxed-radius 9,9,9,9,9,9,0
    heisd-bench decode --drafter head.safetensors --db runs/db \
        --calibration runs/db/calibration.json --observations 64
    heisd-bench profile --json profile.json
    heisd-bench retrieval --sizes 10000,100000 --dims 4352,256 --json retrieval.json
    heisd-bench retrieval --sizes 10000,100000 --dims 4352 --datatypes float32,float16
    heisd-bench retrieval --sizes 100000 --dims 4352 --quantization int8 --oversampling 2
    heisd-bench retrieval --from-db runs/db --sizes 40000 --quantization none,int8 \
        --centering off,on --ef 48,64 --oversampling 3
    heisd-bench retrieval --from-db runs/db --sizes 273000 --dims 4352 --concentration 0.93 \
        --datatypes float16 --quantization int8 --centering off,on --m 32 --ef-construct 200 \
        --ef 48,64 --oversampling 3          # the paper's size, from our DB's embeddings
    heisd-bench soak --db runs/db --duration-min 60 --window-min 5 --out runs/soak

Observations are the seeded synthetic scenes; with --db, consecutive steps of the DB's
held-out demonstrations (or --demos), so the router sees real EE trajectories.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from heisd_ros.decoding.methods import HYBRID_METHODS, METHOD_NAMES, METHODS
from heisd_ros.tools._common import (
    add_model_arguments,
    episode_loader,
    int_vector,
    load_target_from_args,
    recorded_episodes,
    set_threads,
)

_COLUMNS = (("mode", 18), ("fwd/action", 11), ("AL", 6), ("draft tok", 10), ("ms median", 10),
            ("ms p90", 8), ("speed-up", 9), ("exact tok", 10), ("mean |dbin|", 12),
            ("skip", 6), ("router->retr", 13))


def format_table(summary: dict[str, dict]) -> str:
    """Plain-text table of :func:`heisd_ros.decoding.bench_runner.summarise` output."""
    lines = ["".join(name.ljust(width) for name, width in _COLUMNS)]
    for mode, s in summary.items():
        dev = s["agreement_with_ar"]["mean_bin_deviation_per_dim"]
        cells = [mode, f"{s['target_forwards_per_action']:.2f}", f"{s['al']:.2f}",
                 f"{s['draft_tokens_per_action']:.2f}", f"{s['ms_per_action']['median']:.1f}",
                 f"{s['ms_per_action']['p90']:.1f}", f"{s['speedup_vs_ar']:.2f}x",
                 f"{s['agreement_with_ar']['exact_token_rate']:.3f}", f"{sum(dev) / len(dev):.2f}"]
        hybrid = s.get("hybrid") or {}
        share = hybrid.get("router_retrieval_share")
        cells += [f"{hybrid['skip_rate']:.2f}" if hybrid else "-",
                  f"{share:.2f}" if share is not None else "-"]
        lines.append("".join(c.ljust(w) for c, (_, w) in zip(cells, _COLUMNS, strict=True)))
    return "\n".join(lines)


#: ``decode``'s methods by default: the non-hybrid ones; with --db also the hybrid ones but
#: ``heisd_ar`` and those that check behind (``heisd_behind``, ``heisd_deadline``; ask for them
#: with --methods: a background check would overlap the next method's timed decode of the
#: same observation).
DEFAULT_METHODS = tuple(m for m in METHOD_NAMES if m not in HYBRID_METHODS)
DEFAULT_DB_METHODS = tuple(m for m in HYBRID_METHODS
                           if m != "heisd_ar" and not METHODS[m].checks_behind)


def decode_methods(args) -> list[str]:
    """``--methods`` checked against the method table, AR first (the reference).

    Raises:
        ValueError: an unknown name (the valid ones listed), or a hybrid method without --db.
    """
    from heisd_ros.decoding.methods import METHODS, check_method

    if args.methods:
        names = [m for m in args.methods.split(",") if m]
    else:
        names = list(DEFAULT_METHODS) + (list(DEFAULT_DB_METHODS) if args.db else [])
    for name in names:
        check_method(name, "--methods")
        if METHODS[name].hybrid and not args.db:
            raise ValueError(f"--methods: {name!r} queries a retrieval DB; pass --db")
    return ["ar"] + [n for n in dict.fromkeys(names) if n != "ar"]


def load_head(args, target):
    """The draft head of ``--drafter``, else the shipped one for the shipped small VLA.

    Anything else gets an untrained head, a warning on stderr, and ``untrained`` True in the
    returned ``HeadChoice`` (``heisd_ros.models.draft_head_choice``).
    """
    from heisd_ros.decoder_loader import CLI_NAMES, DecoderOptions, choose_head

    options = DecoderOptions(drafter_path=args.drafter or "", names=CLI_NAMES)
    return choose_head(target, options, _target_file(args), args.seed, _warn)


def _target_file(args):
    """The small-VLA file of ``--target`` (None: OpenVLA, or a random init)."""
    from heisd_ros.models.draft_head_choice import target_file

    return target_file(args.target) if getattr(args, "model", "small") == "small" else None


def _warn(text: str) -> None:
    print(f"heisd-bench: WARNING: {text}", file=sys.stderr)


def decode_options(args, radius_bins, tree):
    """The loader's options of ``decode``'s command line (with --db: the hybrid methods')."""
    from heisd_ros.decoder_loader import CLI_NAMES, DecoderOptions

    hybrid = {}
    if args.db:
        hybrid = {"db_dir": str(args.stats_dir or args.db),
                  "router_stats_path": args.router_stats or "",
                  "calibration_path": args.calibration or "", "retrieval_k": args.retrieval_k,
                  "retrieval_deadline_s": args.deadline_ms / 1e3}
    return DecoderOptions(drafter_path=args.drafter or "", relaxed_radius_bins=radius_bins,
                          drafter_tree=tree, names={**CLI_NAMES, "db_dir": "--stats-dir",
                                                    "retrieval_deadline_s": "--deadline-ms"},
                          **hybrid)


def run_decode(args) -> dict:
    """The ``decode`` subcommand: the methods side by side; returns the JSON."""
    import torch

    from heisd_ros.decoder_loader import load_resources
    from heisd_ros.decoding.bench_runner import run_interleaved, summarise
    from heisd_ros.decoding.builder import build_decoder
    from heisd_ros.decoding.drafter_source import DraftTreeConfig
    from heisd_ros.models.synthetic_scenes import SyntheticScenes

    methods = decode_methods(args)
    target, description = load_target_from_args(args)
    tree = DraftTreeConfig(top_k=args.top_k, max_depth=args.depth, node_budget=args.budget)
    radius = int_vector(args.relaxed_radius, 7, "--relaxed-radius")
    options = decode_options(args, radius, tree)
    # the one loader: draft head, and with --db the calibration checked against the target
    loaded = load_resources(target, methods, options, target_file=_target_file(args),
                            seed=args.seed, warn=_warn)
    choice, resources = loaded.head, loaded.resources
    if args.db:
        scenes, hybrid_info = _hybrid_resources(args, target, resources, options,
                                                [m for m in methods if m in HYBRID_METHODS])
    else:
        scenes = list(SyntheticScenes(args.observations + args.warmup, seed=args.seed))
        hybrid_info = None
    modes = {m: build_decoder(m, resources) for m in methods}
    records = run_interleaved(modes, scenes[args.warmup:], warmup=scenes[:args.warmup])
    fitted = (fit_latency_profile(args, records, target, description)
              if args.latency_profile_out else None)
    return {"latency_profile": fitted, "target": description,
            "drafter": choice and choice.description,
            "drafter_untrained": bool(choice and choice.untrained),
            "observations": args.observations, "hybrid": hybrid_info, "warmup": args.warmup,
            "seed": args.seed, "threads": torch.get_num_threads(),
            "tree": asdict(tree), "relaxed_radius_bins": list(radius),
            "modes": summarise(records)}


def fit_latency_profile(args, records, target, description: str) -> dict:
    """Fit a profile to ``records``' stage times, write it, and say what it predicts."""
    import platform

    import torch

    from heisd_ros.latency.counters import DecisionCounters
    from heisd_ros.latency.fit import fit_and_save

    device = target.device
    if device.type == "cuda":
        machine = torch.cuda.get_device_name(device)
    else:
        machine = (f"{platform.processor() or platform.machine()} CPU, "
                   f"{torch.get_num_threads()} threads")
    steps: dict[str, list[dict]] = {}
    for r in records:
        steps.setdefault(r.mode, []).append(
            {"counters": DecisionCounters.from_stats(r.result.stats).to_dict(),
             "stage_ms": dict(r.result.stats.stage_ms)})
    out = Path(args.latency_profile_out)
    return fit_and_save(steps, out, name=args.profile_name or out.stem,
                        description=f"{description} on {machine}",
                        check_occupies="device" if device.type == "cuda" else "core",
                        command=" ".join(["heisd-bench decode", *sys.argv[2:]]),
                        machine=f"{machine}; model: {description}")


def _hybrid_resources(args, target, resources, options,
                      methods: list[str]) -> tuple[list, dict]:
    """Fill ``resources`` with the DB's store and router statistics; observations from demos."""
    from heisd_ros.data.npz_episodes import iter_episode_paths
    from heisd_ros.decoder_loader import open_warm_store, resolve_router_stats
    from heisd_ros.retrieval.store_config import StoreConfig

    stats_dir = Path(args.stats_dir or args.db)
    offline = json.loads((stats_dir / "offline_stats.json").read_text(encoding="utf-8"))
    key = "held_out_episodes" if offline.get("held_out_episodes") else "db_episodes"
    paths = (iter_episode_paths(args.demos) if args.demos
             else recorded_episodes(offline, key, "--demos"))
    wanted = args.observations + args.warmup
    observations, suite = [], None
    load = episode_loader(offline)  # npz or rosbag2, as the DB was built
    for path in paths:
        record = load(path)
        suite = suite or record.suite
        observations += [record.observation(t) for t in range(record.num_steps)]
        if len(observations) >= wanted:
            break
    router_stats = resolve_router_stats(options, suite=suite).path
    # checked against the target; timed decoding starts with the shards loaded, as on the robot
    store = open_warm_store(StoreConfig(path=args.db, exact_search=args.exact), target)
    # Each hybrid decoder gets its own Retriever (K = --retrieval-k) over this store.
    resources.store, resources.router_stats = store, router_stats
    return observations[:wanted], {"db": args.db, "methods": methods,
                                   "calibration": args.calibration,
                                   "router_stats": router_stats, "suite": suite}


def demo_shaped_vectors(n: int, dim: int, seed: int = 0, n_tasks: int = 8,
                        episode_len: int = 130, latent: int = 24, noise: float = 0.05,
                        episode_seed: int | None = None):
    """Demonstration-shaped (n, dim) unit float32 rows.

    Per task a smooth latent curve, per episode a smooth offset, projected to ``dim`` with
    additive noise (relative norm ``noise``); consecutive rows are consecutive steps.
    ``seed`` fixes the space (tasks, projection); ``episode_seed`` the demonstrations, so
    queries are new demonstrations of the same tasks in the same space.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    proj = rng.normal(size=(latent, dim)).astype(np.float32) / np.sqrt(latent)
    freqs = rng.uniform(0.5, 3.0, size=(n_tasks, latent))
    phase = rng.uniform(0, 2 * np.pi, size=(n_tasks, latent))
    out = np.empty((n, dim), np.float32)
    rng = np.random.default_rng(seed + 1_000_003 if episode_seed is None else episode_seed)
    for start in range(0, n, episode_len):
        task = (start // episode_len) % n_tasks
        rows = min(episode_len, n - start)
        # Each demonstration runs the task's path at its own pace (a random time warp).
        t = np.linspace(0, 1, episode_len) ** np.exp(rng.normal(0, 0.2))
        offset = 0.2 * rng.normal(size=latent) + 0.1 * np.sin(
            np.outer(t, rng.uniform(0.5, 2, latent)) + rng.uniform(0, 6, latent))
        z = np.sin(np.outer(t, freqs[task]) * 2 * np.pi + phase[task]) + offset
        x = z[:rows].astype(np.float32) @ proj
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        x += noise * rng.normal(size=x.shape).astype(np.float32) / np.sqrt(dim)
        out[start:start + rows] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def _rss_mb() -> float:
    with open("/proc/self/status", encoding="utf-8") as handle:
        line = next(x for x in handle if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def _dir_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def bench_store(config, vectors, queries, k: int, efs=(64,), warmup: int = 20) -> list[dict]:
    """Build, reopen and query one store; per query-time ef, latency and recall@k.

    Latency is wall-clock per ``store.search`` (what a caller waits) and process CPU time per
    search (all threads; on a shared machine the wall-clock tail is mostly time spent waiting
    for a core, the CPU time is not). After reopening, ``store.warm_up()`` runs as a serving
    process would (timed as ``warm_up_s``); the first ``warmup`` queries are not measured.
    """
    import time
    from dataclasses import replace

    import numpy as np

    from heisd_ros.retrieval.records import records_from_episode
    from heisd_ros.retrieval.store import open_store

    payload = records_from_episode("bench", 0, np.zeros((1, 7)), np.zeros((1, 7)),
                                   np.zeros((1, 3)))[0].to_payload()
    rss0, start = _rss_mb(), time.perf_counter()
    store = open_store(config, create=True, dimension=vectors.shape[1], model_fingerprint="b")
    store.create_collection("bench")
    from tqdm import tqdm

    with tqdm(total=len(vectors), desc=f"build {len(vectors)}x{vectors.shape[1]}", unit="vec",
              file=sys.stderr, disable=len(vectors) < 50_000) as bar:
        for lo in range(0, len(vectors), 4096):
            chunk = vectors[lo:lo + 4096]
            store.upsert("bench", range(lo, lo + len(chunk)), chunk, [payload] * len(chunk))
            bar.update(len(chunk))
        bar.set_postfix_str("indexing (HNSW, optimize)")
        store.finalize()
    build_s = time.perf_counter() - start
    exact = _exact_top_k(vectors, queries, k)
    rows, in_memory = [], config.path == ":memory:"
    for ef in efs if not in_memory else efs[:1]:   # an in-memory DB cannot be reopened
        reopen_s = warm_up_s = None
        if not in_memory:
            store.close()
            start = time.perf_counter()
            store = open_store(replace(config, hnsw_ef=ef), dimension=vectors.shape[1],
                               model_fingerprint="b")
            store.search("bench", queries[0], k)        # the first query loads the shard
            reopen_s = time.perf_counter() - start
            start = time.perf_counter()
            store.warm_up()
            warm_up_s = time.perf_counter() - start
        for q in queries[:warmup]:
            store.search("bench", q, k)
        ms, cpu_ms, recall = [], [], []
        for q, truth in zip(queries, exact, strict=True):
            c0, t0 = time.process_time_ns(), time.perf_counter_ns()
            hits = store.search("bench", q, k)
            ms.append((time.perf_counter_ns() - t0) / 1e6)
            cpu_ms.append((time.process_time_ns() - c0) / 1e6)
            recall.append(len({h.id for h in hits} & set(truth.tolist())) / k)
        rows.append({"hnsw_ef": None if in_memory else ef,
                     "latency_ms": _stats_ms(ms), "cpu_ms": _stats_ms(cpu_ms),
                     f"recall_at_{k}": float(np.mean(recall)), "build_s": build_s,
                     "reopen_s": reopen_s, "warm_up_s": warm_up_s,
                     "rss_growth_mb": _rss_mb() - rss0,
                     "disk_mb": None if in_memory else _dir_mb(Path(config.path))})
    store.close()
    return rows


def _stats_ms(values) -> dict:
    import numpy as np

    return {"median": float(np.median(values)), "p99": float(np.percentile(values, 99)),
            "mean": float(np.mean(values))}


def _exact_top_k(vectors, queries, k: int):
    """Exact cosine top-k ids of each query (rows are unit vectors), in row chunks."""
    import numpy as np

    best_ids = np.zeros((len(queries), 0), np.int64)
    best = np.zeros((len(queries), 0), np.float32)
    for lo in range(0, len(vectors), 20000):
        scores = queries @ np.asarray(vectors[lo:lo + 20000], np.float32).T
        top = np.argsort(-scores, axis=1)[:, :k]
        best = np.concatenate([best, np.take_along_axis(scores, top, 1)], axis=1)
        best_ids = np.concatenate([best_ids, top + lo], axis=1)
        order = np.argsort(-best, axis=1, kind="stable")[:, :k]
        best, best_ids = np.take_along_axis(best, order, 1), np.take_along_axis(best_ids, order, 1)
    return best_ids


def run_retrieval(args) -> dict:
    """The ``retrieval`` subcommand: every (size, dim, backend) combination; returns the JSON."""
    import shutil
    import tempfile
    import time

    from heisd_ros.retrieval.store_config import StoreConfig

    rows, source = [], {"kind": "synthetic", "noise": args.noise}
    dims = [int(d) for d in args.dims.split(",")] if args.dims else [None]
    centerings = [{"off": False, "on": True}[c] for c in args.centering.split(",")]
    quantizations = args.quantization.split(",")
    for dim in dims:
        for n in (int(s) for s in args.sizes.split(",")):
            if args.db:
                from heisd_ros.tools.retrieval_vectors import ShapeOptions, real_shaped

                vectors, queries, info = real_shaped(args.db, n, args.queries, ShapeOptions(
                    concentration=args.concentration, dim=dim, perturb=args.perturb,
                    query_every=args.query_every, seed=args.seed))
                source = {"kind": "db", **info}
                print(f"vectors from {args.db}: {len(vectors)} x {vectors.shape[1]}, pairwise "
                      f"cosine p1/p50/p99 {info['pairwise_cosine_p1_p50_p99']}",
                      file=sys.stderr)
            else:
                dim = dim or 256
                vectors = demo_shaped_vectors(n, dim, seed=args.seed, noise=args.noise)
                queries = demo_shaped_vectors(args.queries * 13, dim, seed=args.seed,
                                              noise=args.noise, episode_seed=args.seed + 1)[::13]
            start = time.perf_counter()
            _exact_top_k(vectors, queries[:20], args.k)
            exact_ms = (time.perf_counter() - start) * 1e3 / len(queries[:20])
            backends = []
            for quantization in quantizations:
                for centered in centerings:
                    for dt in args.datatypes.split(","):
                        name = ("edge-" + (dt if dt != "float32" else "hnsw")
                                + (f"-{quantization}" if quantization != "none" else "")
                                + ("-centered" if centered else ""))
                        backends.append((name, {"backend": "edge", "vector_datatype": dt,
                                                "quantization": quantization,
                                                "centering": centered}))
            if len(vectors) <= args.qdrant_max:
                # Local mode searches exactly and ignores quantization: recorded as "none".
                backends.append(("qdrant-local", {"backend": "qdrant",
                                                  "vector_datatype": "float32",
                                                  "quantization": "none", "centering": False}))
            for name, kwargs in backends:
                root = Path(tempfile.mkdtemp(prefix="heisd_bench_", dir=args.workdir))
                try:
                    # qdrant-client's local mode persists by rewriting its file per upsert
                    # (minutes at 10k); in memory it is the same search code.
                    path = ":memory:" if name == "qdrant-local" else str(root / "db")
                    config = StoreConfig(path=path, hnsw_m=args.m,
                                         hnsw_ef_construct=args.ef_construct,
                                         quantization_rescore=True,
                                         quantization_oversampling=args.oversampling, **kwargs)
                    efs = [int(e) for e in args.ef.split(",")]
                    results = bench_store(config, vectors, queries, args.k, efs)
                finally:
                    shutil.rmtree(root, ignore_errors=True)
                quantized = kwargs["quantization"] != "none"
                index = {"vector_datatype": kwargs["vector_datatype"], "hnsw_m": args.m,
                         "hnsw_ef_construct": args.ef_construct,
                         "quantization": kwargs["quantization"],
                         "centering": kwargs["centering"],
                         "oversampling": args.oversampling if quantized else None,
                         "rescore": True if quantized else None}
                rows += [{"backend": name, "n": len(vectors), "dim": int(vectors.shape[1]),
                          "queries": len(queries), "numpy_exact_ms": exact_ms, **index,
                          **result}
                         for result in results]
            del vectors
    return {"k": args.k, "seed": args.seed, "noise": args.noise, "source": source,
            "hnsw_m": args.m, "hnsw_ef_construct": args.ef_construct,
            "quantization": args.quantization, "oversampling": args.oversampling,
            "centering": args.centering, "rescore": True, "rows": rows}


def format_retrieval(result: dict) -> str:
    """Plain-text table of :func:`run_retrieval` output."""
    k = result["k"]
    lines = [f"{'backend':24}{'m':>4}{'ef':>5}{'quant':>9}{'n':>8}{'dim':>6}"
             f"{'med ms':>9}{'p99 ms':>9}"
             f"{'cpu med':>9}{'cpu p99':>9}"
             f"{'recall@' + str(k):>10}{'exact ms':>10}{'build s':>9}{'reopen s':>9}"
             f"{'warm s':>8}{'RSS MB':>8}{'disk MB':>9}"]
    for r in result["rows"]:
        lat, cpu, disk = r["latency_ms"], r["cpu_ms"], r["disk_mb"]
        quant = r.get("quantization") or "none"
        if quant != "none":
            quant += f"x{r['oversampling']:g}"
        if r.get("centering"):
            quant += "+c"
        lines.append(f"{r['backend']:24}{_num(r.get('hnsw_m'), 'd'):>4}"
                     f"{_num(r['hnsw_ef'], 'd'):>5}{quant:>9}{r['n']:>8}{r['dim']:>6}"
                     f"{lat['median']:>9.3f}{lat['p99']:>9.3f}{cpu['median']:>9.3f}"
                     f"{cpu['p99']:>9.3f}{r[f'recall_at_{k}']:>10.3f}{r['numpy_exact_ms']:>10.2f}"
                     f"{r['build_s']:>9.1f}{_num(r['reopen_s'], '.2f'):>9}"
                     f"{_num(r.get('warm_up_s'), '.2f'):>8}"
                     f"{r['rss_growth_mb']:>8.0f}{_num(disk, '.0f'):>9}")
    return "\n".join(lines)


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def run_profile(args) -> dict:
    """The ``profile`` subcommand: cost of each building block; returns the JSON."""
    from heisd_ros.decoding.bench_runner import cost_profile
    from heisd_ros.models.synthetic_scenes import SyntheticScenes

    target, description = load_target_from_args(args)
    head = load_head(args, target).head
    obs = SyntheticScenes(1, seed=args.seed).scene(0)
    profile = cost_profile(target, head, obs, tree_nodes=args.budget, draft_nodes=args.top_k,
                           repeats=args.repeats)
    params = sum(p.numel() for p in target.net.parameters()) if hasattr(target, "net") else None
    return {"target": description, "target_parameters": params, **profile}


def _choices(*valid: str):
    """An argparse type: a comma-separated list of ``valid`` values, kept as text."""
    def parse(text: str) -> str:
        items = [t.strip() for t in text.split(",") if t.strip()]
        bad = [t for t in items if t not in valid]
        if not items or bad:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of "
                                             f"{list(valid)}, got {text!r}")
        return ",".join(items)
    return parse


def _oversampling(text: str) -> float:
    """``--oversampling``: a finite number >= 1."""
    import math

    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 1:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 1, got {text!r}")
    return value


def parse_args(argv=None) -> argparse.Namespace:
    """Command line of ``heisd-bench``."""
    parser = argparse.ArgumentParser(prog="heisd-bench", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("decode", "profile"):
        p = sub.add_parser(name)
        p.add_argument("--target", default=None, help="small-VLA safetensors (default: shipped "
                       "weights if present, else a seeded random init)")
        add_model_arguments(p)
        p.add_argument("--drafter", default=None,
                       help="draft head safetensors from heisd-train-drafter (default: the "
                            "shipped head for the shipped small VLA; else an untrained one, "
                            "with a warning)")
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
    decode.add_argument("--db", default=None, help="retrieval DB (edge) from heisd-build-db; "
                        "adds the hybrid methods")
    decode.add_argument("--stats-dir", default=None, help="offline_stats.json dir (default --db)")
    decode.add_argument("--demos", default=None, help="npz root for the observations "
                        "(default: the DB's held-out episodes)")
    decode.add_argument("--methods", default=None,
                        help="comma-separated names of the method table (AR always runs; "
                             f"default: {','.join(DEFAULT_METHODS)}, with --db also "
                             f"{','.join(DEFAULT_DB_METHODS)})")
    decode.add_argument("--latency-profile-out", default=None, metavar="FILE",
                        help="fit a latency profile (YAML) to the stage times measured here, "
                             "for heisd-eval --real-time --latency-profile FILE; the JSON gets "
                             "its prediction of each method's mean step latency")
    decode.add_argument("--profile-name", default=None,
                        help="name of the fitted profile (default: the file's stem)")
    decode.add_argument("--router-stats", default=None)
    decode.add_argument("--calibration", default=None, help="heisd-calibrate JSON")
    decode.add_argument("--retrieval-k", type=int, default=4)
    decode.add_argument("--deadline-ms", type=float, default=5.0)
    decode.add_argument("--exact", action="store_true", help="exact DB search")
    profile.add_argument("--repeats", type=int, default=20)
    retrieval = sub.add_parser("retrieval")
    retrieval.add_argument("--sizes", default="10000,100000", help="vectors per run")
    retrieval.add_argument("--dims", default=None, help="4352 = the paper's; 256 = ours "
                           "(default: 4352,256 synthetic; with --from-db the DB's own, a "
                           "larger one lifts its vectors)")
    retrieval.add_argument("--queries", type=int, default=200)
    retrieval.add_argument("--k", type=int, default=8)
    retrieval.add_argument("--ef", default="64,256", help="HNSW ef values at query time")
    retrieval.add_argument("--datatypes", default="float32", help="edge vector datatypes "
                           "to compare: float32, float16 (comma-separated)")
    retrieval.add_argument("--quantization", type=_choices("none", "int8"), default="none",
                           help="edge vector quantizations to compare (comma-separated): "
                           "int8 searches scalar int8 copies and rescores the candidates "
                           "with the stored vectors")
    retrieval.add_argument("--centering", type=_choices("off", "on"), default="off",
                           help="store centred unit vectors searched by Euclidean distance "
                           "(same neighbours and cosine scores; see StoreConfig.centering); "
                           "comma-separated to compare, e.g. off,on")
    retrieval.add_argument("--oversampling", type=_oversampling, default=2.0,
                           help="with --quantization int8: candidates fetched per result "
                           "before rescoring (>= 1)")
    retrieval.add_argument("--m", type=int, default=16, help="HNSW edges per node")
    retrieval.add_argument("--ef-construct", type=int, default=100, help="HNSW build beam")
    retrieval.add_argument("--from-db", "--db", dest="db", default=None,
                           help="draw the vectors from this heisd-build-db DB's embeddings "
                           "(held-out demonstrations are the queries; grown to --sizes by "
                           "points between consecutive steps, lifted to --dims, see "
                           "heisd_ros/tools/retrieval_vectors.py) instead of synthetic ones")
    retrieval.add_argument("--query-every", type=int, default=10, help="with --from-db: every "
                           "n-th demonstration of a task is held out and queried")
    retrieval.add_argument("--concentration", type=float, default=None, help="with --from-db: "
                           "scale the shared component to this mean pairwise cosine (the "
                           "paper's DINOv2 + SigLIP features sit near 0.9; default: the DB's)")
    retrieval.add_argument("--perturb", type=float, default=0.05, help="with --from-db: "
                           "relative norm of the noise on every vector (over all dimensions)")
    retrieval.add_argument("--qdrant-max", type=int, default=10000, help="largest size run "
                           "through qdrant-client's local mode (pure-Python brute force)")
    retrieval.add_argument("--workdir", default=None, help="where the temporary DBs go")
    retrieval.add_argument("--noise", type=float, default=0.05, help="relative iid noise "
                           "added to the smooth trajectories (larger = closer to iid data)")
    retrieval.add_argument("--seed", type=int, default=0)
    retrieval.add_argument("--json", default=None)
    retrieval.add_argument("--threads", type=int, default=None)
    from heisd_ros.tools.graph import bench_cli, sim_cli, soak

    bench_cli.add_arguments(sub.add_parser(
        "graph", help="the policy in the running ROS graph vs in-process (graph/bench_cli.py)"))
    sim_cli.add_arguments(sub.add_parser(
        "sim-graph", help="the launched sim graph in real time (graph/sim_cli.py)"))
    soak.add_arguments(sub.add_parser(
        "soak", help="the real-time sim graph for long, reported in windows (graph/soak.py)"))
    return parser.parse_args(argv)


def main(argv=None) -> int:
    """Entry point of ``heisd-bench``."""
    args = parse_args(argv)
    if args.command == "graph":
        from heisd_ros.tools.graph import bench_cli

        return bench_cli.run(args)
    if args.command == "sim-graph":
        from heisd_ros.tools.graph import sim_cli

        return sim_cli.run(args)
    if args.command == "soak":
        from heisd_ros.tools.graph import soak

        return soak.run(args)
    set_threads(args.threads)
    if args.command == "decode":
        try:
            result = run_decode(args)
        except ValueError as err:
            print(f"heisd-bench: {err}", file=sys.stderr)
            return 2
        print(format_table(result["modes"]))
        if result["latency_profile"]:
            fitted = result["latency_profile"]
            print(f"latency profile written to {fitted['path']}; predicted / measured mean "
                  "ms per action: " + ", ".join(
                      f"{m} {p['predicted_with_waits_ms']:.1f} / {p['measured_ms']:.1f}"
                      for m, p in fitted["prediction"].items()))
    elif args.command == "retrieval":
        result = run_retrieval(args)
        print(format_retrieval(result))
    else:
        result = run_profile(args)
        print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
