"""Qdrant Edge backend: embedded, in-process HNSW shards persisted in one directory.

Layout of ``config.path``::

    heisd_db.json            # manifest (dimension, model fingerprint, ...) + task -> shard dir
    <collection name>/       # one qdrant-edge shard per task (wal/, segments/, edge_config.json)

qdrant-edge-py facts this relies on (v0.9): ``EdgeShard.create(dir, EdgeConfig)`` refuses a
directory that already holds segments; ``EdgeShard.load(dir, EdgeConfig)`` reopens it (the
config must repeat the vector params); a shard takes a lock on its WAL, so one process at a
time; HNSW is built only by ``optimize()`` for segments above ``indexing_threshold`` (KB);
``flush()`` persists. Search is synchronous and cannot be cancelled.

Latency (see ``heisd-bench retrieval``): a search asks the shard for ids and scores only; the
payloads come from an in-process cache (pickled, ~0.5 KB per point, filled by one scroll when a
shard is first searched or warmed up, dropped on upsert). Asking the search for payloads cost
several ms per query at 100k points, and a separate ``retrieve`` ~1 ms (the shard reads them
from disk through the page cache, so the cost grows under memory pressure);
``StoreConfig.payload_cache = False`` uses ``retrieve`` instead. ``warm_up()`` also reads
every vector once; a serving process should call it after opening (``VectorStore.warm_up``).

The vector datatype (``StoreConfig.vector_datatype``) and the quantization
(``StoreConfig.quantization``) are fixed when a shard is created and read back from its
``edge_config.json`` on load, so a float16 or int8 DB opens with any serving config (loading
with other vector params would rewrite the stored config: a quantization left out of it is
dropped for every segment optimized later). int8 is a ``ScalarQuantizationConfig`` (Int8,
quantile 0.99, ``Memory.Pinned``) in the shard's vector params; the quantized copies are built
by ``optimize()`` with the HNSW graph, so segments below the indexing threshold have none. A
non-exact search passes ``QuantizationSearchParams(rescore, oversampling)`` from the serving
config (a shard without quantized vectors ignores them); an exact search passes
``ignore=True`` and scores the original vectors.
"""

from __future__ import annotations

import array
import json
import os
import pickle
from pathlib import Path

import numpy as np

from heisd_ros.retrieval.store import Hit, VectorStore
from heisd_ros.retrieval.store_config import INT8_QUANTILE, StoreConfig

MANIFEST_FILE = "heisd_db.json"
SHARD_CONFIG_FILE = "edge_config.json"
#: Searches through the index that ``warm_up`` runs per task, from stored points.
WARM_UP_SEARCHES = 256  # written by qdrant-edge into every shard directory


class EdgeStore(VectorStore):
    """:class:`VectorStore` on ``qdrant_edge.EdgeShard``; one shard per task."""

    def __init__(self, config: StoreConfig) -> None:
        super().__init__(config)
        import qdrant_edge  # lazy: only the edge backend needs the native module

        self._qe = qdrant_edge
        self._root = Path(config.path).expanduser()
        self._shards: dict[str, object] = {}  # collection name -> open EdgeShard
        self._payloads: dict[str, dict[int, bytes]] = {}  # collection -> id -> pickled payload
        self._quantization_params = qdrant_edge.QuantizationSearchParams(
            **config.quantization_search())

    def _where(self) -> str:
        return f"edge:{self._root}"

    def _hint(self, exc: Exception) -> str:
        text = str(exc)
        if "WouldBlock" in text or "init WAL" in text:
            return (" (another process has this shard open: an embedded DB serves one process "
                    "at a time; stop the other process, or serve the DB from a Qdrant server "
                    "with backend: qdrant and a url)")
        return ""

    def _absence_reason(self) -> str:
        if not self._root.exists():
            return "the directory does not exist"
        if not self._root.is_dir():
            return "the path is not a directory"
        return f"the directory has no {MANIFEST_FILE}"

    def _load_meta(self) -> dict | None:
        path = self._root / MANIFEST_FILE
        if not path.is_file():
            return None
        return json.loads(path.read_text(encoding="utf-8"))

    def _save_meta(self, meta: dict) -> None:
        self._root.mkdir(parents=True, exist_ok=True)
        tmp = self._root / (MANIFEST_FILE + ".tmp")
        tmp.write_text(json.dumps(meta, indent=2, sort_keys=True), encoding="utf-8")
        os.replace(tmp, self._root / MANIFEST_FILE)  # atomic: never a half-written manifest

    def _edge_config(self, stored: dict | None = None):
        """The shard config; for an existing shard, ``stored`` (:func:`_stored_index`) wins."""
        qe, cfg = self._qe, self.config
        stored = stored or {}
        dtype = {"float32": qe.VectorStorageDatatype.Float32,
                 "float16": qe.VectorStorageDatatype.Float16}[
                     stored.get("datatype") or cfg.vector_datatype]
        quantization = stored.get("quantization") or cfg.quantization
        quantization_config = None
        if quantization == "int8":
            quantization_config = qe.ScalarQuantizationConfig(
                type=qe.ScalarType.Int8, quantile=stored.get("quantile", INT8_QUANTILE),
                memory=qe.Memory.Pinned)
        return qe.EdgeConfig(
            # The HNSW graph on the heap (273k points, m 32: ~70 MB) and the vectors
            # memory-mapped but read in when the shard loads: a search after opening then
            # finds both in RAM (Qdrant's memory tiers; vectors cannot be pinned).
            vectors=qe.EdgeVectorParams(size=self.dimension, distance=(
                qe.Distance.Euclid if self.centered else qe.Distance.Cosine),
                                        datatype=dtype, quantization_config=quantization_config,
                                        memory=qe.Memory.Cached),
            hnsw_config=qe.HnswIndexConfig(m=cfg.hnsw_m, ef_construct=cfg.hnsw_ef_construct,
                                           full_scan_threshold=cfg.full_scan_threshold_kb,
                                           memory=qe.Memory.Pinned),
            optimizers=qe.EdgeOptimizersConfig(indexing_threshold=cfg.full_scan_threshold_kb),
            max_search_threads=cfg.max_search_threads or None)

    def _shard(self, name: str):
        shard = self._shards.get(name)
        if shard is None:
            directory = self._root / name
            if not directory.is_dir():
                raise FileNotFoundError(f"shard directory {directory} is missing")
            shard = self._qe.EdgeShard.load(str(directory),
                                            self._edge_config(_stored_index(directory)))
            self._shards[name] = shard
        return shard

    def _create(self, name: str) -> None:
        directory = self._root / name
        if (directory / "segments").exists():  # left over from an interrupted build
            self._shards[name] = self._qe.EdgeShard.load(
                str(directory), self._edge_config(_stored_index(directory)))
        else:
            self._shards[name] = self._qe.EdgeShard.create(str(directory), self._edge_config())

    def _upsert(self, name: str, task: str, ids: list[int], vectors: np.ndarray,
                payloads: list[dict]) -> None:
        qe = self._qe
        points = [qe.Point(i, _floats(v), p)
                  for i, v, p in zip(ids, vectors, payloads, strict=True)]
        self._payloads.pop(name, None)
        self._shard(name).update(qe.UpdateOperation.upsert_points(points))

    def _search(self, name: str, task: str, vector: np.ndarray, k: int,
                deadline_s: float | None) -> list[Hit]:
        qe = self._qe
        params = qe.SearchParams(hnsw_ef=max(self.config.hnsw_ef, k),
                                 exact=self.config.exact_search,
                                 quantization=self._quantization_params)
        request = qe.SearchRequest(query=qe.Query.Nearest(_floats(vector)), limit=k,
                                   params=params, with_payload=False, with_vector=False)
        shard = self._shard(name)
        cache = self._payload_cache(name) if self.config.payload_cache else None
        points = shard.search(request)
        if cache is not None and all(p.id in cache for p in points):
            return [Hit(id=int(p.id), score=float(p.score), payload=pickle.loads(cache[p.id]))
                    for p in points]
        if not points:
            return []
        records = shard.retrieve([p.id for p in points], with_payload=True, with_vector=False)
        payloads = {r.id: r.payload for r in records}
        return [Hit(id=int(p.id), score=float(p.score), payload=dict(payloads.get(p.id) or {}))
                for p in points]

    def _payload_cache(self, name: str) -> dict[int, bytes]:
        cache = self._payloads.get(name)
        if cache is None:
            cache = {int(r.id): pickle.dumps(dict(r.payload or {}), pickle.HIGHEST_PROTOCOL)
                     for r in self._scroll(name, with_payload=True, with_vector=False)}
            self._payloads[name] = cache
        return cache

    def _scroll(self, name: str, **what):
        shard, offset = self._shard(name), None
        while True:
            records, offset = shard.scroll(self._qe.ScrollRequest(offset=offset, limit=1024,
                                                                  **what))
            yield from records
            if offset is None or not records:
                return

    def _warm_up(self, name: str, task: str) -> None:
        qe, shard = self._qe, self._shard(name)
        if self.config.payload_cache:
            self._payload_cache(name)
        # One exact search reads every stored vector once. Without it the first few hundred
        # searches after opening pay for bringing the vector storage in (100k x 4352 on the
        # 2-core dev machine: median 6.8 ms instead of 0.7 ms); it costs ~1 s per 100k.
        probe = [self.dimension ** -0.5] * self.dimension
        shard.search(qe.SearchRequest(query=qe.Query.Nearest(probe), limit=1,
                                      params=qe.SearchParams(
                                          exact=True,
                                          quantization=qe.QuantizationSearchParams(ignore=True)),
                                      with_payload=False,
                                      with_vector=False))
        # It does not walk the graph or read the quantized copies: searches through the
        # index do, from stored points spread over the collection (the first searches after
        # opening a 273k x 4352 DB had a p99 of 1.6-3.6 ms, later ones 0.5-0.9 ms).
        ids = sorted(self._payload_cache(name)) if self.config.payload_cache else [
            int(r.id) for r in self._scroll(name, with_payload=False, with_vector=False)]
        pick = [int(i) for i in ids[::max(1, len(ids) // WARM_UP_SEARCHES)]]
        params = qe.SearchParams(hnsw_ef=self.config.hnsw_ef, exact=False,
                                 quantization=self._quantization_params)
        for record in shard.retrieve(pick, with_payload=False, with_vector=True):
            shard.search(qe.SearchRequest(query=qe.Query.Nearest(_floats(record.vector)),
                                          limit=8, params=params, with_payload=False,
                                          with_vector=False))

    def stored_quantization(self, task: str) -> str:
        """Quantization the task's shard was built with ("none" or "int8"), from its config."""
        name = self._name(task)
        stored = self._guard(f"read the shard config of {task!r}", _stored_index,
                             self._root / name)
        return stored.get("quantization") or "none"

    def _export(self, name: str, task: str) -> tuple[list[int], list]:
        records = list(self._scroll(name, with_payload=False, with_vector=True))
        return [int(r.id) for r in records], [r.vector for r in records]

    def _count(self, name: str, task: str) -> int:
        return int(self._shard(name).count(self._qe.CountRequest(exact=True)))

    def _finalize(self, name: str) -> None:
        shard = self._shard(name)
        shard.optimize()  # builds HNSW for segments above the indexing threshold
        shard.flush()

    def _close(self) -> None:
        shards, self._shards, self._payloads = self._shards, {}, {}
        for shard in shards.values():
            shard.flush()
            shard.close()


def _floats(vector: np.ndarray) -> array.array:
    """A float32 vector as qdrant-edge takes it (a sequence of floats).

    An ``array.array`` converts in about half the time of a list (4352-d: 50 us instead of
    85 us per query, 58 us instead of 114 us per upserted point); the values are identical.
    """
    return array.array("f", np.ascontiguousarray(vector, dtype=np.float32).tobytes())


def _stored_index(directory: Path) -> dict:
    """Vector params a shard was created with, from its ``edge_config.json``.

    Returns ``{"datatype": "float32" | "float16", "quantization": "none" | "int8"}``, plus
    ``"quantile"`` for int8; ``{}`` when unknown (e.g. no config file). A quantization this
    code does not build (product, binary, ...) raises ValueError: reopening the shard without
    it would drop it from the stored config.
    """
    try:
        meta = json.loads((directory / SHARD_CONFIG_FILE).read_text(encoding="utf-8"))
        params = meta["vectors"][""]
        datatype = str(params.get("datatype", "float32")).lower()
        quantization = params.get("quantization_config") or meta.get("quantization_config")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}
    if not quantization:
        return {"datatype": datatype, "quantization": "none"}
    scalar = quantization.get("scalar") if isinstance(quantization, dict) else None
    if not isinstance(scalar, dict) or str(scalar.get("type", "")).lower() != "int8":
        raise ValueError(f"shard {directory} was built with a quantization this code does not "
                         f"support: {quantization!r}")
    return {"datatype": datatype, "quantization": "int8",
            "quantile": float(scalar.get("quantile") or INT8_QUANTILE)}
