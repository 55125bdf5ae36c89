"""Configuration of the vector store and the metadata stored with every HeiSD database."""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass

#: Backends by name; :func:`heisd_ros.retrieval.store.open_store` dispatches on these.
BACKENDS: tuple[str, ...] = ("edge", "qdrant")
#: How the ``qdrant`` backend lays tasks out: one collection per task, or one shared
#: collection whose points carry a ``task`` payload field used as a filter (tenant shards).
LAYOUTS: tuple[str, ...] = ("per_task", "shared")
#: Stored vector element types: float16 halves memory (273k x 4352: 2.4 GB instead of 4.8 GB).
VECTOR_DATATYPES: tuple[str, ...] = ("float32", "float16")
#: Quantization of the stored vectors for the HNSW search: "int8" keeps a scalar int8 copy
#: (quantile 0.99, in RAM; a quarter of float32) that the graph walk scores, rescored with the
#: original vectors; "none" scores the original vectors.
QUANTIZATIONS: tuple[str, ...] = ("none", "int8")
#: int8 range: this quantile of the values (outliers are clipped), for every backend.
INT8_QUANTILE = 0.99
#: How a DB compares vectors. "cosine": the backend's cosine distance on the stored vectors.
#: "cosine_centered": unit vectors minus the DB's mean direction, searched by Euclidean
#: distance; for unit vectors |q - x|^2 = 2 - 2 cos(q, x), and a shift changes no distance,
#: so the ranking is the cosine ranking and the store reports 1 - d^2 / 2, the cosine. What
#: changes is what the index sees: without the component every vector shares (embeddings of
#: one robot's camera frames point the same way, pairwise cosines up to 0.99), int8
#: quantization spends its 256 levels on what tells the vectors apart.
DISTANCES: tuple[str, ...] = ("cosine", "cosine_centered")
#: Bump when the payload layout (see ``records.py``) changes incompatibly.
PAYLOAD_SCHEMA_VERSION = 1
MANIFEST_FORMAT = "heisd-retrieval-db"

#: From this many points a DB gets the large-DB index (:func:`index_for_size`).
LARGE_DB_POINTS = 100_000
#: Index settings by DB size: below :data:`LARGE_DB_POINTS` the plain float32 HNSW index
#: already finds the exact neighbours in well under a millisecond; above it float16 vectors
#: halve the memory, int8 copies of the centred vectors make the graph walk cheap, and a
#: denser graph (m 32, ef_construct 200) keeps recall (see docs/results, the large-DB runs).
SMALL_DB_INDEX = {"vector_datatype": "float32", "quantization": "none", "centering": False,
                  "hnsw_m": 16, "hnsw_ef_construct": 100}
LARGE_DB_INDEX = {"vector_datatype": "float16", "quantization": "int8", "centering": True,
                  "hnsw_m": 32, "hnsw_ef_construct": 200}
#: What a large DB is served with (the retrieval node's store.hnsw_ef and
#: store.quantization_oversampling).
LARGE_DB_SERVING = {"hnsw_ef": 48, "quantization_oversampling": 3.0}


def index_for_size(points: int) -> tuple[dict, str]:
    """(index settings, the reason in words) for a DB of ``points`` points."""
    if points >= LARGE_DB_POINTS:
        return dict(LARGE_DB_INDEX), (
            f"{points} points >= {LARGE_DB_POINTS}: large-DB index (float16 vectors, int8 "
            f"quantization of centred vectors, HNSW m 32 / ef_construct 200); the retrieval "
            f"node's defaults serve it (store.hnsw_ef 64 >= {LARGE_DB_SERVING['hnsw_ef']}, "
            f"store.quantization_oversampling "
            f"{LARGE_DB_SERVING['quantization_oversampling']:g})")
    return dict(SMALL_DB_INDEX), (
        f"{points} points < {LARGE_DB_POINTS}: plain float32 HNSW index (m 16 / ef_construct "
        f"100), exact enough and fast at this size")


_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,31}$")


@dataclass(frozen=True)
class StoreConfig:
    """Where the vector DB lives and how it is indexed.

    Attributes:
        backend: "edge" (Qdrant Edge, embedded in-process, persisted in ``path``; the robot
            default) or "qdrant" (qdrant-client against ``url``, or its local mode at ``path``,
            ``":memory:"`` for a throw-away DB).
        path: DB directory (edge, qdrant local mode). Empty for a server.
        url: Qdrant server/cluster URL (qdrant backend only), e.g. "http://db:6333".
        api_key: API key for the server; empty for none.
        timeout_s: client request timeout for the server, seconds.
        layout: "per_task" collections or one "shared" collection filtered by task.
        collection_prefix: prefix of every collection name (several DBs on one server).
        replication_factor, shard_number: collection settings on a server/cluster.
        hnsw_m, hnsw_ef_construct: HNSW graph parameters at build time.
        hnsw_ef: HNSW beam width at query time.
        exact_search: brute-force search (exact; for tests and small DBs).
        full_scan_threshold_kb: below this segment size (KB) the edge backend scans instead of
            walking the graph.
        max_search_threads: edge search threads (0 = one per CPU); keep small on a shared CPU.
        vector_datatype: element type of the stored vectors when a collection is created
            ("float32" or "float16"); an existing edge DB keeps the type it was built with.
        quantization: quantization of the stored vectors when a collection is created ("none"
            or "int8": scalar int8 copies, quantile 0.99, kept in RAM, scored by the HNSW
            search); an existing edge DB keeps the quantization it was built with. Exact search
            always scores the original vectors.
        quantization_rescore: rescore the candidates found with the quantized vectors with the
            original vectors (exact scores, better recall); applies to every query of a
            quantized collection.
        quantization_oversampling: the quantized search fetches ``oversampling * k``
            candidates before rescoring them to the top k (finite, >= 1); applies to every
            query of a quantized collection (3: what the large-DB index was measured with).
        centering: when a DB is created: store unit vectors minus the DB's mean direction
            and search them by Euclidean distance ("cosine_centered" in
            :data:`DISTANCES`: the same neighbours and cosine scores as cosine search, but
            int8 quantization keeps its precision on embeddings that all point one way); an
            existing DB keeps how it was built.
        payload_cache: edge backend: keep every point's payload in process memory (~0.5 KB
            per point, filled when a task is first searched or warmed up), so a search reads
            no payload from disk; False fetches the k payloads from the shard per search.
    """

    backend: str = "edge"
    path: str = ""
    url: str = ""
    api_key: str = ""
    timeout_s: float = 5.0
    layout: str = "per_task"
    collection_prefix: str = "heisd"
    replication_factor: int = 1
    shard_number: int = 1
    hnsw_m: int = 16
    hnsw_ef_construct: int = 100
    hnsw_ef: int = 64
    exact_search: bool = False
    full_scan_threshold_kb: int = 1000
    max_search_threads: int = 1
    vector_datatype: str = "float32"
    payload_cache: bool = True
    quantization: str = "none"
    quantization_rescore: bool = True
    quantization_oversampling: float = 3.0
    centering: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.centering, bool):
            raise ValueError(f"centering: expected a bool, got {self.centering!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend: unknown backend {self.backend!r}; valid: {list(BACKENDS)}")
        if self.vector_datatype not in VECTOR_DATATYPES:
            raise ValueError(f"vector_datatype: unknown type {self.vector_datatype!r}; valid: "
                             f"{list(VECTOR_DATATYPES)}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization: unknown quantization {self.quantization!r}; "
                             f"valid: {list(QUANTIZATIONS)}")
        if not isinstance(self.quantization_rescore, bool):
            raise ValueError(f"quantization_rescore: expected a bool, "
                             f"got {self.quantization_rescore!r}")
        oversampling = self.quantization_oversampling
        if isinstance(oversampling, bool) or not isinstance(oversampling, (int, float)) \
                or not math.isfinite(oversampling) or oversampling < 1:
            raise ValueError(f"quantization_oversampling: expected a finite number >= 1, "
                             f"got {oversampling!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout: unknown layout {self.layout!r}; valid: {list(LAYOUTS)}")
        if self.backend == "edge":
            if not self.path:
                raise ValueError("path: the edge backend needs a DB directory, got ''")
            if self.url:
                raise ValueError(f"url: the edge backend is embedded and takes no url, "
                                 f"got {self.url!r}")
            if self.layout != "per_task":
                raise ValueError(f"layout: the edge backend stores one shard per task; "
                                 f"got {self.layout!r}, valid: ['per_task']")
        elif bool(self.path) == bool(self.url):
            raise ValueError(f"path/url: the qdrant backend needs exactly one of them, "
                             f"got path={self.path!r} url={self.url!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s: expected > 0 s, got {self.timeout_s}")
        if not _NAME_RE.match(self.collection_prefix):
            raise ValueError(f"collection_prefix: expected a letter then up to 31 of "
                             f"[A-Za-z0-9_-], got {self.collection_prefix!r}")
        for name in ("replication_factor", "shard_number", "hnsw_ef_construct", "hnsw_ef"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected >= 1, got {getattr(self, name)}")
        if self.hnsw_m < 2:
            raise ValueError(f"hnsw_m: expected >= 2, got {self.hnsw_m}")
        if self.full_scan_threshold_kb < 0:
            raise ValueError(f"full_scan_threshold_kb: expected >= 0, "
                             f"got {self.full_scan_threshold_kb}")
        if self.max_search_threads < 0:
            raise ValueError(f"max_search_threads: expected >= 0, got {self.max_search_threads}")

    @property
    def is_local(self) -> bool:
        """True when no server is involved (edge, or qdrant-client's local mode)."""
        return not self.url

    def quantization_search(self) -> dict:
        """Keyword arguments of a ``QuantizationSearchParams`` for every query (both backends).

        Exact search scores the original vectors; an HNSW search scores the quantized ones
        (where a collection has them) and rescores its oversampled candidates.
        """
        if self.exact_search:
            return {"ignore": True}
        return {"ignore": False, "rescore": self.quantization_rescore,
                "oversampling": float(self.quantization_oversampling)}


@dataclass(frozen=True)
class DbManifest:
    """What a DB was built with; checked on open so a stale DB fails loudly, not silently.

    Attributes:
        dimension: embedding dimension of every vector.
        model_fingerprint: identifies the embedding model/config (e.g. checkpoint hash +
            pooling); retrieval with another embedding would return nonsense neighbours.
        distance: one of :data:`DISTANCES` (scores are cosine similarities either way).
        payload_schema_version: version of the payload layout in ``records.py``.
        center: "cosine_centered": the mean direction subtracted from every unit vector
            (set from the first vectors stored; None before any).
    """

    dimension: int
    model_fingerprint: str
    distance: str = "cosine"
    payload_schema_version: int = PAYLOAD_SCHEMA_VERSION
    center: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.dimension, bool) or not isinstance(self.dimension, int) \
                or self.dimension < 1:
            raise ValueError(f"dimension: expected a positive int, got {self.dimension!r}")
        if not isinstance(self.model_fingerprint, str) or not self.model_fingerprint.strip():
            raise ValueError(f"model_fingerprint: expected a non-empty string, "
                             f"got {self.model_fingerprint!r}")
        if self.distance not in DISTANCES:
            raise ValueError(f"distance: expected one of {list(DISTANCES)}, got "
                             f"{self.distance!r}")
        if self.center is not None:
            if self.distance != "cosine_centered":
                raise ValueError(f"center: only a 'cosine_centered' DB has one, this one is "
                                 f"{self.distance!r}")
            if len(self.center) != self.dimension or not all(
                    math.isfinite(v) for v in self.center):
                raise ValueError(f"center: expected {self.dimension} finite values, got "
                                 f"{len(self.center)}")

    def to_dict(self) -> dict:
        """JSON-ready form, tagged with the manifest format."""
        out = {"format": MANIFEST_FORMAT, "dimension": self.dimension,
               "model_fingerprint": self.model_fingerprint, "distance": self.distance,
               "payload_schema_version": self.payload_schema_version}
        if self.center is not None:
            out["center"] = [float(v) for v in self.center]
        return out

    @classmethod
    def from_dict(cls, data: dict) -> DbManifest:
        """Parse a stored manifest; raise ValueError naming what is missing or malformed."""
        if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"manifest: not a {MANIFEST_FORMAT} manifest: {data!r:.200}")
        missing = [k for k in ("dimension", "model_fingerprint") if k not in data]
        if missing:
            raise ValueError(f"manifest: missing fields {missing}")
        return cls(dimension=data["dimension"], model_fingerprint=data["model_fingerprint"],
                   distance=data.get("distance", "cosine"),
                   payload_schema_version=data.get("payload_schema_version", 1),
                   center=None if data.get("center") is None
                   else tuple(float(v) for v in data["center"]))


def collection_name(prefix: str, task: str) -> str:
    """Deterministic, backend-safe collection name for a task (any string, e.g. an instruction).

    A readable slug plus 8 hex digits of the task's SHA-1, so different tasks never collide
    even when their slugs do.
    """
    if not isinstance(task, str) or not task.strip():
        raise ValueError(f"task: expected a non-empty string, got {task!r}")
    slug = re.sub(r"[^A-Za-z0-9]+", "_", task).strip("_").lower()[:40] or "task"
    digest = hashlib.sha1(task.encode("utf-8")).hexdigest()[:8]
    return f"{prefix}_{slug}_{digest}"
