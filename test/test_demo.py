"""The demo's DB reuse: a DB built for another model is detected (and rebuilt by ``main``)."""

from __future__ import annotations

from heisd_ros.models.loading import load_target
from heisd_ros.retrieval.embedding import model_fingerprint
from heisd_ros.retrieval.store import open_store
from heisd_ros.retrieval.store_config import StoreConfig
from heisd_ros.tools import demo


def _db(path, fingerprint: str):
    open_store(StoreConfig(path=str(path)), create=True, dimension=8,
               model_fingerprint=fingerprint).close()
    return path


def test_absent_db_is_not_stale(tmp_path):
    assert demo._stale_db_reason(tmp_path / "db") is None


def test_db_of_the_shipped_model_is_reused(tmp_path):
    target, _ = load_target(None)
    assert demo._stale_db_reason(_db(tmp_path / "db", model_fingerprint(target))) is None


def test_db_of_another_model_is_stale_and_says_which(tmp_path):
    reason = demo._stale_db_reason(_db(tmp_path / "db", "SmallVLA:vla_pooled:0000000000000000"))
    assert reason is not None and "0000000000000000" in reason and "model_fingerprint" in reason
