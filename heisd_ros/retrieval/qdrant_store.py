"""qdrant-client backend: a Qdrant server or cluster, or qdrant-client's local mode.

Layouts (``StoreConfig.layout``):

- ``per_task``: one collection per task, named by :func:`collection_name`.
- ``shared``: one collection ``<prefix>_shared``; every point carries ``task`` in its payload,
  indexed as a tenant keyword on a server, and searches filter on it. Point ids must then be
  unique across tasks.

The DB metadata (manifest + task list) lives in a one-point collection ``<prefix>_manifest``
so a server holds it next to the data. Local mode (``path`` set, ``":memory:"`` included)
always searches exactly and ignores sharding/replication/HNSW settings.

``StoreConfig.quantization = "int8"`` creates collections with scalar int8 quantization
(quantile 0.99, always in RAM); a server's HNSW searches then pass the config's rescore and
oversampling. Local mode accepts the setting and ignores it (exact search on the originals).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from heisd_ros.retrieval.store import Hit, VectorStore
from heisd_ros.retrieval.store_config import INT8_QUANTILE, StoreConfig

_META_POINT_ID = 0


class QdrantStore(VectorStore):
    """:class:`VectorStore` on ``qdrant_client.QdrantClient``."""

    def __init__(self, config: StoreConfig, create: bool = False) -> None:
        super().__init__(config)
        from qdrant_client import QdrantClient, models  # lazy: only this backend needs it

        self._models = models
        self._meta_name = f"{config.collection_prefix}_manifest"
        self._shared_name = f"{config.collection_prefix}_shared"
        self._missing_path = False
        if config.url:
            self._client = QdrantClient(url=config.url, api_key=config.api_key or None,
                                        timeout=max(1, math.ceil(config.timeout_s)))
        elif config.path == ":memory:":
            self._client = QdrantClient(location=":memory:")
        else:
            # Local mode creates the directory on open; a serving process must not do that.
            self._missing_path = not create and not Path(config.path).expanduser().is_dir()
            self._client = None if self._missing_path else QdrantClient(path=config.path)

    def _where(self) -> str:
        return f"qdrant:{self.config.url or self.config.path}"

    def _absence_reason(self) -> str:
        if self._missing_path:
            return "the directory does not exist"
        return f"no collection {self._meta_name!r}"

    def _load_meta(self) -> dict | None:
        if self._client is None or not self._client.collection_exists(self._meta_name):
            return None
        records = self._client.retrieve(self._meta_name, [_META_POINT_ID], with_payload=True)
        return dict(records[0].payload or {}) if records else None

    def _save_meta(self, meta: dict) -> None:
        m = self._models
        if not self._client.collection_exists(self._meta_name):
            self._client.create_collection(
                self._meta_name, vectors_config=m.VectorParams(size=1, distance=m.Distance.DOT),
                replication_factor=self.config.replication_factor)
        self._client.upsert(self._meta_name, points=[
            m.PointStruct(id=_META_POINT_ID, vector=[1.0], payload=meta)], wait=True)

    def _target(self, name: str) -> str:
        return self._shared_name if self.config.layout == "shared" else name

    def _task_filter(self, task: str):
        if self.config.layout != "shared":
            return None
        m = self._models
        return m.Filter(must=[m.FieldCondition(key="task", match=m.MatchValue(value=task))])

    def _create(self, name: str) -> None:
        m, cfg = self._models, self.config
        target = self._target(name)
        if self._client.collection_exists(target):
            return
        self._client.create_collection(
            target, vectors_config=m.VectorParams(
                size=self.dimension,
                distance=m.Distance.EUCLID if self.centered else m.Distance.COSINE,
                datatype=m.Datatype.FLOAT16 if cfg.vector_datatype == "float16" else None),
            shard_number=cfg.shard_number, replication_factor=cfg.replication_factor,
            hnsw_config=m.HnswConfigDiff(m=cfg.hnsw_m, ef_construct=cfg.hnsw_ef_construct,
                                         full_scan_threshold=cfg.full_scan_threshold_kb),
            quantization_config=m.ScalarQuantization(scalar=m.ScalarQuantizationConfig(
                type=m.ScalarType.INT8, quantile=INT8_QUANTILE, always_ram=True))
            if cfg.quantization == "int8" else None)
        if cfg.layout == "shared" and not cfg.is_local:  # local mode has no payload indexes
            self._client.create_payload_index(
                target, "task", field_schema=m.KeywordIndexParams(
                    type=m.KeywordIndexType.KEYWORD, is_tenant=True))

    def _upsert(self, name: str, task: str, ids: list[int], vectors: np.ndarray,
                payloads: list[dict]) -> None:
        batch = self._models.Batch(ids=ids, vectors=vectors.tolist(), payloads=payloads)
        self._client.upsert(self._target(name), points=batch, wait=True)

    def _search(self, name: str, task: str, vector: np.ndarray, k: int,
                deadline_s: float | None) -> list[Hit]:
        m, cfg = self._models, self.config
        kwargs = {}
        if not cfg.is_local:  # local mode is always exact and warns about search params
            quantization = m.QuantizationSearchParams(**cfg.quantization_search())
            kwargs["search_params"] = m.SearchParams(hnsw_ef=max(cfg.hnsw_ef, k),
                                                     exact=cfg.exact_search,
                                                     quantization=quantization)
            if deadline_s is not None:  # server-side timeout has whole-second resolution
                kwargs["timeout"] = max(1, math.ceil(deadline_s))
        response = self._client.query_points(
            self._target(name), query=vector.tolist(), limit=k, with_payload=True,
            query_filter=self._task_filter(task), **kwargs)
        return [Hit(id=int(p.id), score=float(p.score), payload=dict(p.payload or {}))
                for p in response.points]

    def _count(self, name: str, task: str) -> int:
        return int(self._client.count(self._target(name), count_filter=self._task_filter(task),
                                      exact=True).count)

    def _export(self, name: str, task: str) -> tuple[list[int], list]:
        ids, vectors, offset = [], [], None
        while True:
            records, offset = self._client.scroll(
                self._target(name), scroll_filter=self._task_filter(task), limit=1024,
                offset=offset, with_payload=False, with_vectors=True)
            ids += [int(r.id) for r in records]
            vectors += [r.vector for r in records]
            if offset is None or not records:
                return ids, vectors

    def _finalize(self, name: str) -> None:
        """A server indexes in the background and local mode needs nothing."""

    def _close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
