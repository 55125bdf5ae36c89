"""Vector-store backends: same behaviour, same results, clear errors (no torch, no ROS)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from heisd_ros.retrieval.errors import (
    BackendError,
    DimensionMismatchError,
    MetadataMismatchError,
    MissingCollectionError,
    MissingDatabaseError,
    RetrievalStatus,
)
from heisd_ros.retrieval.store import open_store
from heisd_ros.retrieval.store_config import DbManifest, StoreConfig, collection_name

REPO = Path(__file__).resolve().parents[1]
DIM = 24
FP = "test-embedder:v1"
TASK = "put the bowl on the plate"


def _config(kind: str, tmp_path, **kw) -> StoreConfig:
    if kind == "edge":
        return StoreConfig(backend="edge", path=str(tmp_path / "edge_db"), **kw)
    if kind == "qdrant_path":
        return StoreConfig(backend="qdrant", path=str(tmp_path / "qdrant_db"), **kw)
    if kind == "qdrant_shared":
        return StoreConfig(backend="qdrant", path=str(tmp_path / "qdrant_shared"),
                           layout="shared", **kw)
    raise AssertionError(kind)


KINDS = ["edge", "qdrant_path", "qdrant_shared"]


def _data(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    vecs = rng.normal(size=(n, DIM)).astype(np.float32)
    payloads = [{"step": i, "bins": [i % 256] * 7} for i in range(n)]
    return vecs, payloads


def _cosine_topk(vecs: np.ndarray, query: np.ndarray, k: int):
    unit = vecs / np.linalg.norm(vecs, axis=1, keepdims=True)
    scores = unit @ (query / np.linalg.norm(query))
    order = np.argsort(-scores, kind="stable")[:k]
    return order.tolist(), scores[order]


@pytest.mark.parametrize("kind", KINDS)
def test_roundtrip_search_count_and_persistence(kind, tmp_path):
    vecs, payloads = _data(60)
    cfg = _config(kind, tmp_path)
    with open_store(cfg, create=True, dimension=DIM, model_fingerprint=FP) as store:
        store.create_collection(TASK, dimension=DIM)
        store.create_collection("other task")
        store.upsert(TASK, range(60), vecs, payloads)
        store.upsert("other task", range(100, 110), vecs[:10], payloads[:10])
        store.finalize()
        assert store.count(TASK) == 60
        assert store.count("other task") == 10
        assert store.list_collections() == sorted([TASK, "other task"])
    # Reopen without create: data, manifest and task list persisted on disk.
    with open_store(cfg, dimension=DIM, model_fingerprint=FP) as store:
        assert store.manifest == DbManifest(dimension=DIM, model_fingerprint=FP)
        assert store.count(TASK) == 60
        hits = store.search(TASK, vecs[7], k=5)
        want_ids, want_scores = _cosine_topk(vecs, vecs[7], 5)
        assert [h.id for h in hits] == want_ids
        np.testing.assert_allclose([h.score for h in hits], want_scores, atol=1e-5)
        assert hits[0].payload["step"] == 7 and hits[0].payload["bins"] == [7] * 7
        assert hits[0].payload["task"] == TASK
        # Tasks never leak into each other, also in the shared layout.
        assert {h.id for h in store.search("other task", vecs[7], k=20)} <= set(range(100, 110))


def test_backends_agree_on_random_data(tmp_path):
    vecs, payloads = _data(300, seed=1)
    queries = np.random.default_rng(2).normal(size=(8, DIM)).astype(np.float32)
    results = {}
    for kind in KINDS:
        cfg = _config(kind, tmp_path, exact_search=True)
        with open_store(cfg, create=True, dimension=DIM, model_fingerprint=FP) as store:
            store.create_collection(TASK)
            store.upsert(TASK, range(300), vecs, payloads)
            store.finalize()
            results[kind] = [store.search(TASK, q, k=6) for q in queries]
    for kind in KINDS[1:]:
        for hits_a, hits_b in zip(results["edge"], results[kind], strict=True):
            assert [h.id for h in hits_a] == [h.id for h in hits_b]
            np.testing.assert_allclose([h.score for h in hits_a], [h.score for h in hits_b],
                                       atol=1e-5)


def test_edge_hnsw_index_finds_near_duplicates(tmp_path):
    rng = np.random.default_rng(3)
    vecs = rng.normal(size=(1500, 16)).astype(np.float32)
    cfg = StoreConfig(path=str(tmp_path / "db"), full_scan_threshold_kb=8, hnsw_ef=64)
    with open_store(cfg, create=True, dimension=16, model_fingerprint=FP) as store:
        store.create_collection(TASK)
        store.upsert(TASK, range(1500), vecs, [{}] * 1500)
        store.finalize()  # segments above the threshold get an HNSW graph
        picks = rng.choice(1500, size=20, replace=False)
        found = [store.search(TASK, vecs[i] + 0.01 * rng.normal(size=16), k=1)[0].id
                 for i in picks]
    assert found == picks.tolist()


@pytest.mark.parametrize("kind", ["qdrant_path", "qdrant_shared"])
def test_qdrant_local_mode_accepts_int8_quantization(kind, tmp_path):
    vecs, payloads = _data(200, seed=4)
    cfg = _config(kind, tmp_path, quantization="int8", quantization_oversampling=3.0)
    with open_store(cfg, create=True, dimension=DIM, model_fingerprint=FP) as store:
        store.create_collection(TASK)
        store.upsert(TASK, range(200), vecs, payloads)
        store.finalize()
    with open_store(cfg, dimension=DIM, model_fingerprint=FP) as store:
        for q in (0, 77, 199):   # local mode ignores the quantization: exact results
            hits = store.search(TASK, vecs[q], k=5)
            want_ids, want_scores = _cosine_topk(vecs, vecs[q], 5)
            assert [h.id for h in hits] == want_ids
            np.testing.assert_allclose([h.score for h in hits], want_scores, atol=1e-5)


class _RecordingClient:
    """Stands in for a QdrantClient at a server: records create_collection/query_points."""

    def __init__(self, **kwargs):
        self.collections, self.queries = {}, []

    def collection_exists(self, name):
        return name in self.collections

    def create_collection(self, name, **kwargs):
        self.collections[name] = kwargs

    def upsert(self, *args, **kwargs):
        pass

    def query_points(self, name, **kwargs):
        self.queries.append(kwargs)
        return type("Response", (), {"points": []})()

    def close(self):
        pass


@pytest.mark.parametrize("exact", [False, True])
def test_qdrant_server_collections_and_searches_carry_int8_settings(monkeypatch, exact):
    import qdrant_client
    from qdrant_client import models

    monkeypatch.setattr(qdrant_client, "QdrantClient", _RecordingClient)
    cfg = StoreConfig(backend="qdrant", url="http://db:6333", quantization="int8",
                      quantization_rescore=False, quantization_oversampling=3.0,
                      exact_search=exact)
    with open_store(cfg, create=True, dimension=DIM, model_fingerprint=FP) as store:
        store.create_collection(TASK)
        assert store.search(TASK, np.ones(DIM), k=4) == []
        client = store._client
        created = client.collections[store._name(TASK)]
        params = client.queries[-1]["search_params"]
    assert created["quantization_config"] == models.ScalarQuantization(
        scalar=models.ScalarQuantizationConfig(type=models.ScalarType.INT8, quantile=0.99,
                                               always_ram=True))
    assert params.exact is exact
    want = (models.QuantizationSearchParams(ignore=True) if exact else
            models.QuantizationSearchParams(ignore=False, rescore=False, oversampling=3.0))
    assert params.quantization == want
    plain = StoreConfig(backend="qdrant", url="http://db:6333")
    with open_store(plain, create=True, dimension=DIM, model_fingerprint=FP) as store:
        store.create_collection(TASK)
        assert store._client.collections[store._name(TASK)]["quantization_config"] is None


@pytest.mark.parametrize("kind", KINDS)
def test_missing_db_path_is_a_clear_error(kind, tmp_path):
    cfg = _config(kind, tmp_path)
    with pytest.raises(MissingDatabaseError, match="does not exist"):
        open_store(cfg)
    assert not (tmp_path / "qdrant_db").exists()  # serving never creates a DB by accident


def test_edge_dir_without_manifest(tmp_path):
    (tmp_path / "db").mkdir()
    with pytest.raises(MissingDatabaseError, match="heisd_db.json"):
        open_store(StoreConfig(path=str(tmp_path / "db")))


@pytest.mark.parametrize("kind", KINDS)
def test_missing_collection_and_dimension_errors(kind, tmp_path):
    with open_store(_config(kind, tmp_path), create=True, dimension=DIM,
                    model_fingerprint=FP) as store:
        store.create_collection(TASK)
        with pytest.raises(MissingCollectionError, match="no collection for task 'nope'") as err:
            store.search("nope", np.ones(DIM), k=3)
        assert err.value.status == RetrievalStatus.EMPTY
        with pytest.raises(DimensionMismatchError, match=f"expected {DIM} values") as err:
            store.search(TASK, np.ones(DIM + 1), k=3)
        assert err.value.status == RetrievalStatus.BAD_REQUEST
        with pytest.raises(DimensionMismatchError):
            store.upsert(TASK, [1], np.ones((1, DIM - 2)), [{}])
        with pytest.raises(DimensionMismatchError):
            store.create_collection("x", dimension=DIM * 2)
        assert store.search(TASK, np.ones(DIM), k=3) == []  # exists but empty


@pytest.mark.parametrize("kind", ["edge", "qdrant_path"])
def test_metadata_mismatch(kind, tmp_path):
    cfg = _config(kind, tmp_path)
    open_store(cfg, create=True, dimension=DIM, model_fingerprint=FP).close()
    with pytest.raises(MetadataMismatchError, match="dimension: DB has 24, expected 32"):
        open_store(cfg, dimension=32)
    with pytest.raises(MetadataMismatchError, match="model_fingerprint"):
        open_store(cfg, create=True, dimension=DIM, model_fingerprint="another-model")
    open_store(cfg).close()  # no expectation given: opens whatever is there


def test_edge_corrupt_manifest_is_backend_error(tmp_path):
    cfg = _config("edge", tmp_path)
    open_store(cfg, create=True, dimension=DIM, model_fingerprint=FP).close()
    (tmp_path / "edge_db" / "heisd_db.json").write_text('{"format": "something else"}')
    with pytest.raises(BackendError, match="corrupt DB metadata"):
        open_store(cfg)


def test_upsert_rejects_bad_input(tmp_path):
    with open_store(_config("edge", tmp_path), create=True, dimension=DIM,
                    model_fingerprint=FP) as store:
        store.create_collection(TASK)
        with pytest.raises(ValueError, match="unique"):
            store.upsert(TASK, [1, 1], np.ones((2, DIM)), [{}, {}])
        with pytest.raises(ValueError, match="non-zero"):
            store.upsert(TASK, [1], np.zeros((1, DIM)), [{}])
        with pytest.raises(ValueError, match="upserted into"):
            store.upsert(TASK, [1], np.ones((1, DIM)), [{"task": "other"}])


@pytest.mark.parametrize("kwargs, field", [
    (dict(backend="milvus", path="x"), "backend"),
    (dict(backend="edge"), "path"),
    (dict(backend="edge", path="x", layout="shared"), "layout"),
    (dict(backend="qdrant"), "path/url"),
    (dict(backend="qdrant", path="x", url="http://h:6333"), "path/url"),
    (dict(path="x", layout="sharded"), "layout"),
    (dict(path="x", replication_factor=0), "replication_factor"),
    (dict(path="x", collection_prefix="9bad"), "collection_prefix"),
    (dict(path="x", timeout_s=0), "timeout_s"),
])
def test_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        StoreConfig(**kwargs)


def test_unknown_backend_lists_valid_names():
    with pytest.raises(ValueError, match=r"valid: \['edge', 'qdrant'\]"):
        StoreConfig(backend="faiss", path="x")


def test_collection_names_are_safe_and_distinct():
    a = collection_name("heisd", "open the drawer!")
    b = collection_name("heisd", "open the drawer?")
    assert a != b and a.startswith("heisd_open_the_drawer_")
    assert all(ch.isalnum() or ch in "_-" for ch in a)


def test_serving_path_imports_neither_torch_nor_rclpy():
    code = ("import sys, heisd_ros.retrieval.retriever, heisd_ros.retrieval.edge_store, "
            "heisd_ros.retrieval.qdrant_store, heisd_ros.kinematics.router\n"
            "bad = [m for m in ('torch', 'rclpy') if m in sys.modules]\n"
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_group_tree_runs_without_torch():
    code = ("import sys, numpy as np\n"
            "from heisd_ros.decoding.retrieval_tree import build_group_tree\n"
            "build_group_tree(np.zeros((2, 7), int), 32000).to_draft_tree()\n"
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_an_embedded_db_open_in_another_process_is_named_as_such(tmp_path):
    """Qdrant Edge locks a shard's WAL: the second process gets an error that says why."""
    vecs, payloads = _data(20)
    cfg = _config("edge", tmp_path)
    with open_store(cfg, create=True, dimension=DIM, model_fingerprint=FP) as store:
        store.create_collection(TASK, dimension=DIM)
        store.upsert(TASK, range(20), vecs, payloads)
        store.finalize()
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys\n"
         "from heisd_ros.retrieval.store import open_store\n"
         "from heisd_ros.retrieval.store_config import StoreConfig\n"
         f"store = open_store(StoreConfig(backend='edge', path={cfg.path!r}))\n"
         "store.warm_up()\n"
         "print('ready', flush=True)\n"
         "sys.stdin.read()\n"],  # holds the shard until it is killed, however long that takes
        cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        with open_store(cfg, dimension=DIM, model_fingerprint=FP) as store:
            with pytest.raises(BackendError, match="another process has this shard open"):
                store.warm_up()
    finally:
        holder.kill()
        holder.wait()
        holder.stdin.close()
    # Once the other process is gone, the DB opens again.
    with open_store(cfg, dimension=DIM, model_fingerprint=FP) as store:
        store.warm_up()
        assert store.count(TASK) == 20


def _concentrated(n: int, seed: int = 0) -> np.ndarray:
    """Rows that all point one way (pairwise cosines about 0.9-0.99), like camera embeddings."""
    rng = np.random.default_rng(seed)
    common = rng.normal(size=DIM)
    return (4.0 * common / np.linalg.norm(common)
            + 0.4 * rng.normal(size=(n, DIM))).astype(np.float32)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("exact", [True, False])
def test_a_centered_db_gives_the_cosine_neighbours_and_scores(kind, exact, tmp_path):
    vecs = _concentrated(300)
    cfg = _config(kind, tmp_path, centering=True, exact_search=exact)
    store = open_store(cfg, create=True, dimension=DIM, model_fingerprint=FP)
    store.create_collection(TASK)
    store.upsert(TASK, range(200), vecs[:200], [{"step": i} for i in range(200)])
    store.upsert(TASK, range(200, 300), vecs[200:], [{"step": i} for i in range(200, 300)])
    store.finalize()
    center = np.asarray(store.manifest.center)  # the first batch's mean direction
    unit = vecs / np.linalg.norm(vecs, axis=1, keepdims=True)
    assert np.allclose(center, unit[:200].mean(axis=0), atol=1e-6)
    store.close()
    store = open_store(cfg, dimension=DIM, model_fingerprint=FP)  # kept across reopening
    assert store.manifest.distance == "cosine_centered"
    assert np.allclose(store.manifest.center, center)
    for query in _concentrated(5, seed=1):
        want_ids, want_scores = _cosine_topk(vecs, query, 5)
        hits = store.search(TASK, query, 5)
        assert [h.id for h in hits] == want_ids
        np.testing.assert_allclose([h.score for h in hits], want_scores, atol=2e-5)
        assert hits[0].payload["step"] == want_ids[0]
    if kind == "edge":
        ids, exported = store.export(TASK)
        np.testing.assert_allclose(exported, unit[ids], atol=1e-6)
    store.close()


def test_a_db_keeps_how_it_was_built_whatever_the_serving_config(tmp_path):
    cfg = _config("edge", tmp_path, centering=True)
    with open_store(cfg, create=True, dimension=DIM, model_fingerprint=FP) as store:
        store.create_collection(TASK)
        store.upsert(TASK, range(50), _concentrated(50), [{}] * 50)
    plain = _config("edge", tmp_path)  # a serving config without centering
    with open_store(plain, dimension=DIM, model_fingerprint=FP) as store:
        assert store.centered
        query = _concentrated(1, seed=3)[0]
        assert [h.id for h in store.search(TASK, query, 3)] == _cosine_topk(
            _concentrated(50), query, 3)[0]
    with pytest.raises(ValueError, match="centering"):
        StoreConfig(path="x", centering="yes")
    with pytest.raises(ValueError, match="center"):
        DbManifest(dimension=2, model_fingerprint=FP, center=(0.1, 0.2))
