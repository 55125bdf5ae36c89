"""Qdrant Edge backend: embedded, in-process HNSW shards persisted in one directory.

Layout of ``config.path``::

    heisd_db.json            # manifest (dimension, model fingerprint, ...) + task -> shard dir
    <collection name>/       # one qdrant-edge shard per task (wal/, segments/, edge_config.json)

qdrant-edge-py facts this relies on (v0.9): ``EdgeShard.create(dir, EdgeConfig)`` refuses a
directory that already holds segments; ``EdgeShard.load(dir, EdgeConfig)`` reopens it (the
config must repeat the vector params); a shard takes a lock on its WAL, so one process at a
time; HNSW is built only by ``optimize()`` for segments above ``indexing_threshold`` (KB);
``flush()`` persists. Search is synchronous and cannot be cancelled.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from heisd_ros.retrieval.store import Hit, VectorStore
from heisd_ros.retrieval.store_config import StoreConfig

MANIFEST_FILE = "heisd_db.json"


class EdgeStore(VectorStore):
    """:class:`VectorStore` on ``qdrant_edge.EdgeShard``; one shard per task."""

    def __init__(self, config: StoreConfig) -> None:
        super().__init__(config)
        import qdrant_edge  # lazy: only the edge backend needs the native module

        self._qe = qdrant_edge
        self._root = Path(config.path).expanduser()
        self._shards: dict[str, object] = {}  # collection name -> open EdgeShard

    def _where(self) -> str:
        return f"edge:{self._root}"

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

    def _edge_config(self):
        qe, cfg = self._qe, self.config
        return qe.EdgeConfig(
            vectors=qe.EdgeVectorParams(size=self.dimension, distance=qe.Distance.Cosine),
            hnsw_config=qe.HnswIndexConfig(m=cfg.hnsw_m, ef_construct=cfg.hnsw_ef_construct,
                                           full_scan_threshold=cfg.full_scan_threshold_kb),
            optimizers=qe.EdgeOptimizersConfig(indexing_threshold=cfg.full_scan_threshold_kb),
            max_search_threads=cfg.max_search_threads or None)

    def _shard(self, name: str):
        shard = self._shards.get(name)
        if shard is None:
            directory = self._root / name
            if not directory.is_dir():
                raise FileNotFoundError(f"shard directory {directory} is missing")
            shard = self._qe.EdgeShard.load(str(directory), self._edge_config())
            self._shards[name] = shard
        return shard

    def _create(self, name: str) -> None:
        directory = self._root / name
        if (directory / "segments").exists():  # left over from an interrupted build
            self._shards[name] = self._qe.EdgeShard.load(str(directory), self._edge_config())
        else:
            self._shards[name] = self._qe.EdgeShard.create(str(directory), self._edge_config())

    def _upsert(self, name: str, task: str, ids: list[int], vectors: np.ndarray,
                payloads: list[dict]) -> None:
        qe = self._qe
        points = [qe.Point(i, v.tolist(), p)
                  for i, v, p in zip(ids, vectors, payloads, strict=True)]
        self._shard(name).update(qe.UpdateOperation.upsert_points(points))

    def _search(self, name: str, task: str, vector: np.ndarray, k: int,
                deadline_s: float | None) -> list[Hit]:
        qe = self._qe
        params = qe.SearchParams(hnsw_ef=max(self.config.hnsw_ef, k),
                                 exact=self.config.exact_search)
        request = qe.SearchRequest(query=qe.Query.Nearest(vector.tolist()), limit=k,
                                   params=params, with_payload=True, with_vector=False)
        points = self._shard(name).search(request)
        return [Hit(id=int(p.id), score=float(p.score), payload=dict(p.payload or {}))
                for p in points]

    def _count(self, name: str, task: str) -> int:
        return int(self._shard(name).count(self._qe.CountRequest(exact=True)))

    def _finalize(self, name: str) -> None:
        shard = self._shard(name)
        shard.optimize()  # builds HNSW for segments above the indexing threshold
        shard.flush()

    def _close(self) -> None:
        shards, self._shards = self._shards, {}
        for shard in shards.values():
            shard.flush()
            shard.close()
