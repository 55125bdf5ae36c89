"""The vector-store interface: one small abstract class, two Qdrant backends chosen by name.

A database holds one embedding space (dimension + model fingerprint, checked on open) and one
collection per task. Backends implement the ``_``-prefixed primitives; this class owns the
checks, so every backend fails the same way:

- missing DB path / no DB at the server   -> :class:`MissingDatabaseError`
- DB metadata differs from the caller's   -> :class:`MetadataMismatchError`
- no collection for the task              -> :class:`MissingCollectionError` (status EMPTY)
- vector of the wrong dimension           -> :class:`DimensionMismatchError` (BAD_REQUEST)
- anything the backend library raises     -> :class:`BackendError` (ERROR)

Usage::

    store = open_store(StoreConfig(path="db/"), create=True, dimension=4352,
                       model_fingerprint="openvla-7b:dinosiglip-pool")
    store.create_collection("open the drawer")
    store.upsert("open the drawer", ids, vectors, [r.to_payload() for r in records])
    store.finalize()                       # build the HNSW index, flush to disk
    store.close()
    # serving: open_store(config, dimension=4352, model_fingerprint=...) without create
    hits = store.search("open the drawer", query, k=4)
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import numpy as np

from heisd_ros.retrieval.errors import (
    BackendError,
    BadQueryError,
    DimensionMismatchError,
    MetadataMismatchError,
    MissingCollectionError,
    MissingDatabaseError,
    StoreError,
)
from heisd_ros.retrieval.store_config import (
    PAYLOAD_SCHEMA_VERSION,
    DbManifest,
    StoreConfig,
    collection_name,
)

T = TypeVar("T")
_UPSERT_BATCH = 256  # points per backend call: bounded request size for a server


@dataclass(frozen=True)
class Hit:
    """One search result: point id, cosine similarity and the stored payload."""

    id: int
    score: float
    payload: dict[str, Any] = field(default_factory=dict)


class VectorStore(abc.ABC):
    """A HeiSD retrieval database: per-task collections of cosine-compared vectors."""

    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        self._manifest: DbManifest | None = None
        self._collections: dict[str, str] = {}  # task -> backend collection name
        self._closed = False

    # ----------------------------------------------------------------- public interface
    @property
    def manifest(self) -> DbManifest:
        """The DB's stored metadata (dimension, model fingerprint, ...)."""
        assert self._manifest is not None, "store used before _open()"
        return self._manifest

    @property
    def dimension(self) -> int:
        """Embedding dimension of every vector in the DB."""
        return self.manifest.dimension

    def list_collections(self) -> list[str]:
        """Tasks that have a collection, sorted."""
        return sorted(self._collections)

    def has_collection(self, task: str) -> bool:
        """Whether the task has a collection (it may still hold no points)."""
        return task in self._collections

    def create_collection(self, task: str, dimension: int | None = None) -> None:
        """Create the task's collection (cosine, the DB's dimension); no-op if it exists."""
        if dimension is not None and dimension != self.dimension:
            raise DimensionMismatchError(f"dimension: collection for {task!r} requested with "
                                         f"{dimension}, but the DB holds {self.dimension}-d "
                                         f"vectors")
        if task in self._collections:
            return
        name = collection_name(self.config.collection_prefix, task)
        self._guard(f"create collection for {task!r}", self._create, name)
        self._collections[task] = name
        self._guard("save DB metadata", self._save_meta_now)

    def upsert(self, task: str, ids: Sequence[int], vectors: np.ndarray,
               payloads: Sequence[dict[str, Any]]) -> None:
        """Insert or replace points; ``vectors`` is (n, dimension), stored as float32."""
        name = self._name(task)
        vecs = np.asarray(vectors, dtype=np.float32)
        if vecs.ndim != 2 or vecs.shape[1] != self.dimension:
            raise DimensionMismatchError(f"vectors: expected shape (n, {self.dimension}), "
                                         f"got {vecs.shape}")
        id_list = [int(i) for i in ids]
        if len(id_list) != len(vecs) or len(payloads) != len(vecs):
            raise ValueError(f"ids/vectors/payloads: lengths differ: {len(id_list)}, "
                             f"{len(vecs)}, {len(payloads)}")
        if any(i < 0 or i >= 2**64 for i in id_list) or len(set(id_list)) != len(id_list):
            raise ValueError("ids: expected unique ints in [0, 2**64)")
        if not np.all(np.isfinite(vecs)) or np.any(np.linalg.norm(vecs, axis=1) == 0):
            raise ValueError("vectors: expected finite, non-zero rows (cosine distance)")
        if self.centered:
            vecs = self._centered(vecs, first=True)
        rows = []
        for payload in payloads:
            if payload.get("task", task) != task:
                raise ValueError(f"payloads: point for task {payload['task']!r} upserted into "
                                 f"{task!r}")
            rows.append({**payload, "task": task})
        for start in range(0, len(id_list), _UPSERT_BATCH):
            end = start + _UPSERT_BATCH
            self._guard(f"upsert into {task!r}", self._upsert, name, task, id_list[start:end],
                        vecs[start:end], rows[start:end])

    def search(self, task: str, vector: np.ndarray, k: int,
               deadline_s: float | None = None) -> list[Hit]:
        """Top-``k`` points of the task by cosine similarity, best first.

        ``deadline_s`` is the time budget in seconds: a server backend passes it on as the
        request timeout; in-process search cannot be interrupted, so callers measure.
        """
        name = self._name(task)
        query = self.check_query(vector)
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise BadQueryError(f"k: expected an int >= 1, got {k!r}")
        if deadline_s is not None and not deadline_s > 0:
            raise BadQueryError(f"deadline_s: expected > 0 s or None, got {deadline_s}")
        if not self.centered:
            return self._guard(f"search {task!r}", self._search, name, task, query, int(k),
                               deadline_s)
        hits = self._guard(f"search {task!r}", self._search, name, task,
                           self._centered(query[None])[0], int(k), deadline_s)
        # Euclidean distance d of unit vectors (a shift keeps it): cos = 1 - d^2 / 2
        return [Hit(h.id, float(np.clip(1.0 - 0.5 * h.score * h.score, -1.0, 1.0)), h.payload)
                for h in hits]

    def count(self, task: str) -> int:
        """Number of points in the task's collection."""
        name = self._name(task)
        return self._guard(f"count {task!r}", self._count, name, task)

    def warm_up(self, tasks: Sequence[str] | None = None) -> None:
        """Load what the first search of each task (default: all) would load, ahead of time.

        A serving process calls this after opening, so no request pays for it under its
        deadline (the edge backend loads each shard and its payload cache lazily).
        """
        for task in self.list_collections() if tasks is None else tasks:
            name = self._name(task)
            self._guard(f"warm up {task!r}", self._warm_up, name, task)

    def export(self, task: str) -> tuple[np.ndarray, np.ndarray]:
        """(ids (n,) int64, vectors (n, dimension) float32) of every point of the task.

        For tools (benchmarks, inspection), not the serving path; cosine backends may return
        the vectors normalised.
        """
        name = self._name(task)
        ids, vectors = self._guard(f"export {task!r}", self._export, name, task)
        order = np.argsort(ids, kind="stable")
        vectors = np.asarray(vectors, np.float32).reshape(-1, self.dimension)[order]
        if self.centered and self.manifest.center is not None:
            vectors = vectors + np.asarray(self.manifest.center, np.float32)  # unit vectors
        return np.asarray(ids, np.int64)[order], vectors

    def finalize(self) -> None:
        """Build the search index and persist everything (call after bulk upserts)."""
        for task, name in self._collections.items():
            self._guard(f"finalize {task!r}", self._finalize, name)

    def close(self) -> None:
        """Flush and release the backend; the store is unusable afterwards."""
        if not self._closed:
            self._closed = True
            self._guard("close", self._close)

    def __enter__(self) -> VectorStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def centered(self) -> bool:
        """Whether the DB stores centred unit vectors ("cosine_centered", see store_config)."""
        return self.manifest.distance == "cosine_centered"

    def _centered(self, vectors: np.ndarray, first: bool = False) -> np.ndarray:
        """Unit rows minus the DB's center; ``first``: the first vectors stored set it."""
        unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        if self.manifest.center is None:
            if not first:
                return unit.astype(np.float32)  # an empty DB: any center gives no hits
            center = tuple(float(v) for v in unit.mean(axis=0))
            self._manifest = replace(self.manifest, center=center)
            self._guard("save DB metadata", self._save_meta_now)
        return (unit - np.asarray(self.manifest.center, np.float32)).astype(np.float32)

    def check_query(self, vector: np.ndarray) -> np.ndarray:
        """Return ``vector`` as float32 (dimension,), or raise a BAD_REQUEST error."""
        query = np.asarray(vector, dtype=np.float32)
        if query.ndim != 1 or query.shape[0] != self.dimension:
            raise DimensionMismatchError(f"embedding: expected {self.dimension} values "
                                         f"(the DB's dimension), got shape {query.shape}")
        if not np.all(np.isfinite(query)) or not np.any(query):
            raise BadQueryError("embedding: expected finite values, not all zero")
        return query

    # ----------------------------------------------------------------- shared machinery
    def _open(self, create: bool, dimension: int | None, model_fingerprint: str | None) -> None:
        """Read (or, with ``create``, write) the DB metadata and check it against the caller."""
        meta = self._guard("read DB metadata", self._load_meta)
        if meta is None:
            if not create:
                raise MissingDatabaseError(f"no HeiSD retrieval DB at {self._where()} "
                                           f"({self._absence_reason()}); build one first "
                                           f"(heisd-build-db) or fix the path/url")
            if dimension is None or model_fingerprint is None:
                raise ValueError("dimension/model_fingerprint: both are needed to create a DB "
                                 f"at {self._where()}")
            self._manifest = DbManifest(
                dimension=dimension, model_fingerprint=model_fingerprint,
                distance="cosine_centered" if self.config.centering else "cosine")
            self._guard("save DB metadata", self._save_meta_now)
            return
        try:
            self._manifest = DbManifest.from_dict(meta)
            self._collections = {str(t): str(n) for t, n in meta.get("collections", {}).items()}
        except (ValueError, TypeError, AttributeError) as exc:
            raise BackendError(f"corrupt DB metadata at {self._where()}: {exc}") from exc
        stored = self._manifest
        problems = []
        if dimension is not None and dimension != stored.dimension:
            problems.append(f"dimension: DB has {stored.dimension}, expected {dimension}")
        if model_fingerprint is not None and model_fingerprint != stored.model_fingerprint:
            problems.append(f"model_fingerprint: DB has {stored.model_fingerprint!r}, "
                            f"expected {model_fingerprint!r}")
        if stored.payload_schema_version != PAYLOAD_SCHEMA_VERSION:
            problems.append(f"payload_schema_version: DB has {stored.payload_schema_version}, "
                            f"this code reads {PAYLOAD_SCHEMA_VERSION}")
        if problems:
            raise MetadataMismatchError(f"DB at {self._where()} was built differently; rebuild "
                                        f"it or fix the config: " + "; ".join(problems))

    def _save_meta_now(self) -> None:
        self._save_meta({**self.manifest.to_dict(), "collections": dict(self._collections)})

    def _name(self, task: str) -> str:
        if self._closed:
            raise BackendError(f"the store at {self._where()} is closed")
        try:
            return self._collections[task]
        except KeyError:
            raise MissingCollectionError(f"no collection for task {task!r} in the DB at "
                                         f"{self._where()} ({len(self._collections)} tasks "
                                         f"stored)") from None

    def _guard(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        """Run a backend call; re-raise whatever the backend library throws as BackendError.

        The backend libraries raise bare ``Exception`` (qdrant-edge) or their own HTTP/gRPC
        errors, so this one boundary is deliberately broad; our own errors pass through.
        """
        try:
            return fn(*args)
        except StoreError:
            raise
        except Exception as exc:  # noqa: BLE001 - backend boundary, re-raised with context
            raise BackendError(f"{what} failed at {self._where()}: {exc}{self._hint(exc)}") \
                from exc

    def _hint(self, exc: Exception) -> str:
        """What a person can do about a backend error (appended to its message; "" if unknown)."""
        return ""

    # ----------------------------------------------------------------- backend primitives
    @abc.abstractmethod
    def _where(self) -> str:
        """Human-readable location of the DB (for messages)."""

    @abc.abstractmethod
    def _load_meta(self) -> dict | None:
        """Stored metadata dict, or None when no DB exists there."""

    def _absence_reason(self) -> str:
        """Why ``_load_meta`` found no DB (e.g. the directory does not exist)."""
        return "no metadata found"

    @abc.abstractmethod
    def _save_meta(self, meta: dict) -> None: ...

    @abc.abstractmethod
    def _create(self, name: str) -> None: ...

    @abc.abstractmethod
    def _upsert(self, name: str, task: str, ids: list[int], vectors: np.ndarray,
                payloads: list[dict]) -> None: ...

    @abc.abstractmethod
    def _search(self, name: str, task: str, vector: np.ndarray, k: int,
                deadline_s: float | None) -> list[Hit]: ...

    @abc.abstractmethod
    def _count(self, name: str, task: str) -> int: ...

    @abc.abstractmethod
    def _finalize(self, name: str) -> None: ...

    def _warm_up(self, name: str, task: str) -> None:
        """Load the collection ahead of its first search (default: count its points)."""
        self._count(name, task)

    def _export(self, name: str, task: str) -> tuple[list[int], list]:
        raise BackendError(f"export is not supported by {type(self).__name__}")

    @abc.abstractmethod
    def _close(self) -> None: ...


def open_store(config: StoreConfig, *, create: bool = False, dimension: int | None = None,
               model_fingerprint: str | None = None) -> VectorStore:
    """Open the DB described by ``config`` with the backend it names.

    Args:
        config: backend name and location.
        create: create the DB if absent (build tool); serving code leaves this False so a
            wrong path fails instead of silently creating an empty DB.
        dimension: the embedding dimension the caller expects; checked against the stored
            metadata when given (required to create a DB).
        model_fingerprint: the embedding model the caller uses; checked likewise.
    """
    if config.backend == "edge":
        from heisd_ros.retrieval.edge_store import EdgeStore  # lazy: needs qdrant-edge-py
        store: VectorStore = EdgeStore(config)
    elif config.backend == "qdrant":
        from heisd_ros.retrieval.qdrant_store import QdrantStore  # lazy: needs qdrant-client
        store = QdrantStore(config, create=create)
    else:  # StoreConfig already rejects this; kept for subclasses of the config
        raise ValueError(f"backend: unknown backend {config.backend!r}; valid: ['edge', 'qdrant']")
    try:
        store._open(create, dimension, model_fingerprint)
    except BaseException:
        store._close()
        raise
    return store
