"""Vectors shaped like a DB's real embeddings, at any size and dimension, for heisd-bench.

Retrieval quality depends on how the embeddings lie: the camera embeddings of one robot
all point roughly one way (a large shared component), in a cluster per task, with
consecutive steps of a demonstration close together. Synthetic iid or smooth random
vectors miss that, and with it what int8 quantization loses on such data. So the benchmark
draws its vectors from a DB built by heisd-build-db:

1. **source**: every point of every task's collection, unit-normalised; every
   ``query_every``-th demonstration of each task is held out and its steps are the queries
   (a new run of a task asks for its neighbours among the others);
2. **concentration** (optional): the shared component is scaled until the mean pairwise
   cosine is the one asked for (the paper's DINOv2 + SigLIP features of simulator frames sit
   near 0.9), keeping each point's offset from the mean direction, so the clusters per task
   and the paths of the demonstrations keep their shape;
3. **lift** (optional): to a larger dimension by a random orthonormal embedding, which keeps
   every inner product;
4. **size**: the first ``n`` points, or all of them and new points between consecutive
   steps of a demonstration (a random point of the segment), as more demonstrations of the
   same tasks would add;
5. **perturbation**: Gaussian noise of relative norm ``perturb`` on every vector (queries
   too), spread over all dimensions, so a lifted set is not confined to the source's
   subspace.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ShapeOptions:
    """How :func:`real_shaped` turns a DB's embeddings into a benchmark set (module doc).

    Attributes:
        concentration: mean pairwise cosine to reach (None: as in the DB).
        dim: output dimension (None: the DB's; larger: lifted, never smaller).
        perturb: relative norm of the noise added to every vector.
        query_every: every n-th demonstration of a task is held out as queries.
        seed: seeds the lift, the new points and the noise.
    """

    concentration: float | None = None
    dim: int | None = None
    perturb: float = 0.05
    query_every: int = 10
    seed: int = 0

    def __post_init__(self) -> None:
        if self.concentration is not None and not 0.0 < self.concentration < 1.0:
            raise ValueError(f"concentration: expected a mean cosine in (0, 1), got "
                             f"{self.concentration!r}")
        if not (np.isfinite(self.perturb) and self.perturb >= 0):
            raise ValueError(f"perturb: expected >= 0, got {self.perturb!r}")
        if self.query_every < 2:
            raise ValueError(f"query_every: expected >= 2, got {self.query_every}")


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def read_db(path: str, query_every: int) -> dict:
    """Unit vectors of a DB: base points (with their episode and step) and held-out queries."""
    from heisd_ros.retrieval.embedding import ID_STRIDE
    from heisd_ros.retrieval.store import open_store
    from heisd_ros.retrieval.store_config import StoreConfig

    base, base_ids, queries, tasks = [], [], [], []
    with open_store(StoreConfig(path=path)) as store:
        for t, task in enumerate(store.list_collections()):
            ids, vectors = store.export(task)
            episodes = ids // ID_STRIDE
            held = np.unique(episodes)[query_every - 1::query_every]
            is_query = np.isin(episodes, held)
            base.append(vectors[~is_query])
            base_ids.append(ids[~is_query] + t * ID_STRIDE * 10**6)  # distinct per task
            queries.append(vectors[is_query])
            tasks.append(task)
    if not sum(len(q) for q in queries):
        raise ValueError(f"--from-db: {path} has too few demonstrations per task to hold one "
                         f"out as queries (every {query_every}th); use a DB with more")
    return {"vectors": _unit(np.concatenate(base)), "ids": np.concatenate(base_ids),
            "queries": _unit(np.concatenate(queries)), "tasks": tasks}


def mean_cosine(vectors: np.ndarray) -> float:
    """Mean pairwise cosine of unit rows (= |mean|^2 up to the diagonal's share)."""
    n = len(vectors)
    mean = vectors.mean(axis=0)
    return float((n * n * float(mean @ mean) - n) / (n * (n - 1)))


def concentrate(vectors: np.ndarray, queries: np.ndarray, target: float
                ) -> tuple[np.ndarray, np.ndarray, float]:
    """Scale the shared component of both sets so the base's mean cosine is ``target``.

    Returns the new base, the new queries and the scale applied to the mean direction.
    """
    mean = vectors.mean(axis=0)
    r2 = float(mean @ mean)
    # unit rows x = mean + e: x' = unit(alpha * mean + e) has |mean(x')|^2 about
    # alpha^2 r^2 / (alpha^2 r^2 + 1 - r^2); solve for the target
    alpha = float(np.sqrt(target * (1 - r2) / ((1 - target) * r2)))
    for _ in range(20):  # refine on the data (rows are not all at the mean's distance)
        got = mean_cosine(_unit(vectors + (alpha - 1) * mean))
        if abs(got - target) < 1e-4:
            break
        alpha *= float(np.sqrt(target / (1 - target) * (1 - got) / got))
    return (_unit(vectors + (alpha - 1) * mean), _unit(queries + (alpha - 1) * mean), alpha)


def lift(vectors: np.ndarray, dim: int, seed: int) -> np.ndarray:
    """Rows embedded in ``dim`` dimensions by a random orthonormal map (inner products kept)."""
    src = vectors.shape[1]
    if dim < src:
        raise ValueError(f"--dims: {dim} is below the DB's dimension {src}; only lifting is "
                         f"supported")
    if dim == src:
        return vectors
    basis, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(dim, src)))
    return (vectors @ basis.T.astype(np.float32)).astype(np.float32)


def grow(vectors: np.ndarray, ids: np.ndarray, n: int, seed: int) -> np.ndarray:
    """The first ``n`` rows, or all and new ones between consecutive steps of a demonstration.

    ``ids`` are the points' ids (episode * stride + step, sorted within a task): a row and
    the next one form a segment when the next id is the next step.
    """
    if n <= len(vectors):
        return vectors[:n]
    segments = np.flatnonzero(np.diff(ids) == 1)
    if not len(segments):
        raise ValueError("the DB has no consecutive steps to add points between")
    rng = np.random.default_rng(seed + 17)
    pick = rng.choice(segments, size=n - len(vectors))
    t = rng.uniform(0, 1, size=(len(pick), 1)).astype(np.float32)
    extra = _unit((1 - t) * vectors[pick] + t * vectors[pick + 1])
    return np.concatenate([vectors, extra])


def perturbed(vectors: np.ndarray, perturb: float, seed: int,
              in_place: bool = False) -> np.ndarray:
    """Unit rows plus Gaussian noise of relative norm ``perturb`` over all dimensions.

    ``in_place`` overwrites ``vectors`` (273k x 4352 float32 is 4.8 GB: no second copy).
    """
    if perturb == 0:
        return vectors
    rng = np.random.default_rng(seed + 29)
    out = vectors if in_place else np.empty_like(vectors)
    scale = perturb / np.sqrt(vectors.shape[1])
    for lo in range(0, len(vectors), 8192):  # bounded temporaries at 273k x 4352
        block = vectors[lo:lo + 8192]
        out[lo:lo + 8192] = _unit(block + scale * rng.standard_normal(
            block.shape, dtype=np.float32))
    return out


def real_shaped(path: str, n: int, queries: int, options: ShapeOptions
                ) -> tuple[np.ndarray, np.ndarray, dict]:
    """(n vectors, query vectors, description) drawn from the DB at ``path`` (module doc)."""
    db = read_db(path, options.query_every)
    base, held = db["vectors"], db["queries"]
    info = {"db": str(path), "tasks": db["tasks"], "source_points": int(len(base)),
            "source_dim": int(base.shape[1]), "source_mean_cosine": mean_cosine(base),
            "query_pool": int(len(held))}
    if options.concentration is not None:
        base, held, alpha = concentrate(base, held, options.concentration)
        info["concentration_scale"] = alpha
    dim = options.dim or base.shape[1]
    pick = np.linspace(0, len(held) - 1, min(queries, len(held))).round().astype(int)
    held = held[np.unique(pick)]
    grown = grow(base, db["ids"], n, options.seed)
    vectors = lift(grown, dim, options.seed)
    if vectors is grown or vectors.base is base:
        vectors = vectors.copy()  # never perturb the source in place
    vectors = perturbed(vectors, options.perturb, options.seed, in_place=True)
    held = perturbed(lift(held, dim, options.seed), options.perturb, options.seed + 1)
    sample = vectors[np.random.default_rng(options.seed).choice(
        len(vectors), min(len(vectors), 3000), replace=False)]
    cosines = sample @ sample.T
    upper = cosines[np.triu_indices(len(sample), 1)]
    info.update({"n": int(len(vectors)), "dim": int(dim), "perturb": options.perturb,
                 "concentration": options.concentration,
                 "pairwise_cosine_p1_p50_p99": [float(v) for v in
                                                np.percentile(upper, [1, 50, 99])]})
    return vectors, held, info
