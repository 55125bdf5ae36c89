"""Retriever: top-K with statuses, deadline and per-episode demotion, on a real edge DB."""

from __future__ import annotations

import numpy as np
import pytest

from heisd_ros.retrieval.errors import RetrievalStatus
from heisd_ros.retrieval.records import records_from_episode
from heisd_ros.retrieval.retriever import Retriever, RetrieverConfig
from heisd_ros.retrieval.store import open_store
from heisd_ros.retrieval.store_config import StoreConfig

DIM, N, TASK = 16, 20, "stack the blocks"


class StepClock:
    """A clock that advances ``dt_s`` on every reading (deterministic deadlines)."""

    def __init__(self, dt_s: float) -> None:
        self.t, self.dt_s = 0.0, dt_s

    def __call__(self) -> float:
        self.t += self.dt_s
        return self.t


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    rng = np.random.default_rng(0)
    vecs = rng.normal(size=(N, DIM)).astype(np.float32)
    bins = rng.integers(0, 256, size=(N, 7))
    bins[11] = bins[10]  # neighbouring demo steps repeating the same action
    recs = records_from_episode(TASK, 0, bins, rng.normal(size=(N, 7)), rng.normal(size=(N, 3)))
    store = open_store(StoreConfig(path=str(tmp_path_factory.mktemp("db") / "db"),
                                   exact_search=True),
                       create=True, dimension=DIM, model_fingerprint="fp")
    store.create_collection(TASK)
    store.upsert(TASK, range(N), vecs, [r.to_payload() for r in recs])
    store.create_collection("empty task")
    store.create_collection("broken task")
    store.upsert("broken task", [0], vecs[:1], [{"step": 0}])  # payload missing fields
    store.finalize()
    yield store, vecs
    store.close()


def _ids(result):
    return [c.id for c in result.candidates]


def test_top_k_ok(db):
    store, vecs = db
    res = Retriever(store, RetrieverConfig(k=4)).retrieve(TASK, vecs[3])
    assert res.status == RetrievalStatus.OK and res.ok and res.reason == ""
    assert len(res.candidates) == 4 and res.candidates[0].id == 3
    assert res.candidates[0].score == pytest.approx(1.0, abs=1e-5)
    assert res.candidates[0].record.step == 3
    assert [c.score for c in res.candidates] == sorted((c.score for c in res.candidates),
                                                       reverse=True)
    assert len(Retriever(store).retrieve(TASK, vecs[3], k=7).candidates) == 7


@pytest.mark.parametrize("task, query_dim, k, deadline, status, words", [
    ("no such task", DIM, 4, None, RetrievalStatus.EMPTY, "no collection"),
    ("empty task", DIM, 4, None, RetrievalStatus.EMPTY, "holds no points"),
    (TASK, DIM + 3, 4, None, RetrievalStatus.BAD_REQUEST, "expected 16 values"),
    (TASK, DIM, 0, None, RetrievalStatus.BAD_REQUEST, "k: expected"),
    (TASK, DIM, 4, -1.0, RetrievalStatus.BAD_REQUEST, "deadline_s"),
    ("broken task", DIM, 4, None, RetrievalStatus.ERROR, "malformed candidate"),
])
def test_statuses_carry_reasons(db, task, query_dim, k, deadline, status, words):
    store, _ = db
    res = Retriever(store).retrieve(task, np.ones(query_dim), k=k, deadline_s=deadline)
    assert res.status == status
    assert words in res.reason
    assert res.candidates == ()


def test_deadline_exceeded_returns_what_it_has(db):
    store, vecs = db
    retriever = Retriever(store, RetrieverConfig(k=3), clock=StepClock(dt_s=0.05))
    res = retriever.retrieve(TASK, vecs[5], deadline_s=0.01)
    assert res.status == RetrievalStatus.DEADLINE_EXCEEDED
    assert "budget 10.00 ms" in res.reason
    assert _ids(res)[0] == 5 and len(res.candidates) == 3
    # Zero means "no deadline", as in Retrieve.srv.
    assert retriever.retrieve(TASK, vecs[5], deadline_s=0.0).status == RetrievalStatus.OK
    # A generous budget on the same slow clock is met.
    assert retriever.retrieve(TASK, vecs[5], deadline_s=10.0).status == RetrievalStatus.OK


def test_rejected_candidate_is_demoted_then_forgiven(db):
    store, vecs = db
    retriever = Retriever(store, RetrieverConfig(k=3, demote_steps=2, demote_same_bins=False))
    first = retriever.retrieve(TASK, vecs[7], step=0)
    assert _ids(first)[0] == 7
    retriever.reject([first.candidates[0]], step=0)
    for step in (1, 2):  # demoted for the next 2 steps: sinks below k others
        res = retriever.retrieve(TASK, vecs[7], step=step)
        assert 7 not in _ids(res) and len(res.candidates) == 3
    assert _ids(retriever.retrieve(TASK, vecs[7], step=3))[0] == 7  # expired
    # With every point requested, a demoted one is ranked last rather than dropped.
    retriever.reject([7], step=3)
    res = retriever.retrieve(TASK, vecs[7], k=N, step=4)
    assert _ids(res)[-1] == 7 and res.demoted_ids == (7,)
    retriever.reset_episode()
    assert _ids(retriever.retrieve(TASK, vecs[7], step=4))[0] == 7


def test_default_step_counter_and_request_demotions(db):
    store, vecs = db
    retriever = Retriever(store, RetrieverConfig(k=2, demote_steps=1))
    res = retriever.retrieve(TASK, vecs[2])
    retriever.reject(res.candidates[:1])  # at the step of the last retrieval (0)
    assert 2 not in _ids(retriever.retrieve(TASK, vecs[2]))  # step 1: demoted
    assert _ids(retriever.retrieve(TASK, vecs[2]))[0] == 2  # step 2: expired
    fresh = Retriever(store, RetrieverConfig(k=2))
    assert 4 not in _ids(fresh.retrieve(TASK, vecs[4], demoted_ids=[4]))


def test_same_action_bins_are_demoted_together(db):
    store, vecs = db
    query = vecs[10] + vecs[11]  # both near the top
    retriever = Retriever(store, RetrieverConfig(k=2, demote_same_bins=True))
    res = retriever.retrieve(TASK, query, step=0)
    assert set(_ids(res)) == {10, 11}
    retriever.reject([res.candidates[0]], step=0)
    assert not {10, 11} & set(_ids(retriever.retrieve(TASK, query, step=1)))


def test_penalty_mode_reorders_by_lowered_score(db):
    store, vecs = db
    mild = Retriever(store, RetrieverConfig(k=3, demotion="penalty", demote_penalty=1e-4))
    harsh = Retriever(store, RetrieverConfig(k=3, demotion="penalty", demote_penalty=2.0))
    for retriever in (mild, harsh):
        retriever.reject([9], step=0)
    assert _ids(mild.retrieve(TASK, vecs[9], step=0))[0] == 9  # a clear winner stays first
    res = harsh.retrieve(TASK, vecs[9], step=0)
    assert 9 not in _ids(res)


@pytest.mark.parametrize("kwargs, field", [
    (dict(k=0), "k"), (dict(demote_steps=-1), "demote_steps"),
    (dict(demotion="forget"), "demotion"), (dict(demote_penalty=-0.1), "demote_penalty"),
])
def test_config_errors(kwargs, field):
    with pytest.raises(ValueError, match=field):
        RetrieverConfig(**kwargs)


def test_status_numbers_match_the_service_definition():
    from pathlib import Path

    srv = (Path(__file__).resolve().parents[1] / "srv" / "Retrieve.srv").read_text()
    consts = {}
    for line in srv.splitlines():
        if line.startswith("uint8 STATUS_"):
            name, value = line.split()[1].split("=")
            consts[name.removeprefix("STATUS_")] = int(value)
    assert consts == {s.name: s.value for s in RetrievalStatus}


def test_closed_store_fails_clearly(tmp_path):
    from heisd_ros.retrieval.errors import BackendError

    store = open_store(StoreConfig(path=str(tmp_path / "db")), create=True, dimension=4,
                       model_fingerprint="fp")
    store.create_collection(TASK)
    store.close()
    store.close()  # idempotent
    with pytest.raises(BackendError, match="closed"):
        store.count(TASK)
    res = Retriever(store).retrieve(TASK, np.ones(4))
    assert res.status == RetrievalStatus.ERROR and "closed" in res.reason
