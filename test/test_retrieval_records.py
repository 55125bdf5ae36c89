"""Payload schema of DB points: round trip and validation."""

from __future__ import annotations

import numpy as np
import pytest

from heisd_ros.retrieval.records import LOOKAHEAD, Candidate, StepRecord, records_from_episode


def _episode(T: int = 6):
    rng = np.random.default_rng(0)
    return (rng.integers(0, 256, size=(T, 7)), rng.normal(size=(T, 7)), rng.normal(size=(T, 3)))


def test_records_from_episode_carry_the_next_actions():
    bins, actions, ee = _episode(6)
    recs = records_from_episode("t", 3, bins, actions, ee)
    assert [r.step for r in recs] == list(range(6))
    assert [len(r.lookahead_bins) for r in recs] == [3, 3, 3, 2, 1, 0]
    np.testing.assert_array_equal(recs[1].lookahead_bins, bins[2:5])
    np.testing.assert_allclose(recs[1].lookahead_actions, actions[2:5])
    np.testing.assert_allclose(recs[4].ee_position_m, ee[4])
    assert recs[0].bins.dtype == np.uint8 and recs[0].episode == 3


def test_payload_round_trip_is_plain_json():
    import json

    bins, actions, ee = _episode(5)
    for rec in records_from_episode("pick up the cup", 1, bins, actions, ee):
        payload = json.loads(json.dumps(rec.to_payload()))  # survives JSON unchanged
        back = StepRecord.from_payload(payload)
        np.testing.assert_array_equal(back.bins, rec.bins)
        np.testing.assert_array_equal(back.lookahead_bins, rec.lookahead_bins)
        np.testing.assert_allclose(back.action, rec.action)
        np.testing.assert_allclose(back.lookahead_actions, rec.lookahead_actions)
        assert (back.task, back.episode, back.step) == (rec.task, rec.episode, rec.step)
    cand = Candidate(id=9, score=0.5, record=back)
    assert cand.bins is back.bins


@pytest.mark.parametrize("change, field", [
    (dict(bins=[0] * 6), "bins"),
    (dict(bins=[0, 0, 0, 0, 0, 0, 256]), "bins"),
    (dict(action=[0.0] * 6 + [float("nan")]), "action"),
    (dict(next_bins=[[0] * 7] * 4, next_actions=[[0.0] * 7] * 4), "lookahead"),
    (dict(next_bins=[[0] * 7]), "lookahead"),
    (dict(ee_position_m=[0.0, 0.0]), "ee_position_m"),
    (dict(episode=-1), "episode"),
    (dict(task=""), "task"),
])
def test_malformed_payload_names_the_field(change, field):
    payload = StepRecord("t", 0, 0, [1] * 7, [0.0] * 7, [], [], [0, 0, 0]).to_payload()
    payload.update(change)
    with pytest.raises(ValueError, match=field):
        StepRecord.from_payload(payload)


def test_missing_payload_fields_are_listed():
    with pytest.raises(ValueError, match=r"missing fields \['bins'"):
        StepRecord.from_payload({"task": "t", "episode": 0, "step": 0})


def test_lookahead_limit():
    bins, actions, ee = _episode(4)
    with pytest.raises(ValueError, match="lookahead"):
        records_from_episode("t", 0, bins, actions, ee, lookahead=LOOKAHEAD + 1)
    with pytest.raises(ValueError, match="lengths differ"):
        records_from_episode("t", 0, bins, actions[:3], ee)
