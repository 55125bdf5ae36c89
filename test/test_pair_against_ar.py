"""scripts/pair_against_ar.py: each method against AR on the very same episodes."""

from __future__ import annotations

import json
import math

import pytest

from test.fixtures_scripts import load_script


def _script():
    return load_script("pair_against_ar")


def _episode(seed, method, success, world_s=None, commands=None, suite="s", task="t"):
    entry = {"suite": suite, "task": task, "seed": seed, "method": method, "success": success,
             "steps": 3}
    if world_s is not None:
        entry.update(world_time_s=world_s, commands=commands)
    return entry


def _write(path, episodes):
    path.write_text(json.dumps({"episodes": episodes}))
    return path


def test_pairs_count_wins_interval_and_time_on_episodes_both_solved(tmp_path):
    pair = _script()
    ar = [_episode(0, "ar", True, 10.0, 100), _episode(1, "ar", True, 20.0, 200),
          _episode(2, "ar", False, 20.0, 200), _episode(3, "ar", False, 20.0, 200)]
    heisd = [_episode(0, "heisd", True, 6.0, 120), _episode(1, "heisd", False, 20.0, 240),
             _episode(2, "heisd", True, 9.0, 90), _episode(3, "heisd", True, 8.0, 80)]
    # two files: AR's episodes in one, the method's in the other
    episodes = pair.load_episodes([_write(tmp_path / "a.json", ar),
                                   _write(tmp_path / "b.json", heisd)])
    row = pair.compare(episodes, "heisd", None)
    assert (row["episodes"], row["successes"], row["ar_successes"]) == (4, 3, 2)
    assert (row["wins"], row["losses"]) == (2, 1)
    # differences 0, -1, +1, +1: mean 0.25, sample sd sqrt(0.91667), half 1.96 sd / 2
    half = 1.96 * math.sqrt((0.0625 + 1.5625 + 0.5625 + 0.5625) / 3 / 4)
    assert row["diff_points"] == pytest.approx(25.0)
    assert row["diff_lo"] == pytest.approx(100 * (0.25 - half))
    assert row["diff_hi"] == pytest.approx(100 * (0.25 + half))
    assert row["p"] == pytest.approx(1.0)              # 2 against 1 discordant: p = 1
    # only seed 0 was solved by both: 6 s against 10 s, 120 commands against 100
    assert row["both"] == 1
    assert row["world_time_vs_ar"] == pytest.approx(0.6)
    assert row["commands_vs_ar"] == pytest.approx(1.2)
    assert row["world_s_per_command_vs_ar"] == pytest.approx(0.5)
    assert "| all | heisd | 3/4 | 2/4 | +25.0" not in pair.table(episodes)   # one suite: no 'all'
    assert "| s | heisd | 3/4 | 2/4 | +25.0 [" in pair.table(episodes)


def test_mcnemar_p_is_the_exact_binomial_tail():
    pair = _script()
    assert pair.mcnemar_p(0, 0) == 1.0
    assert pair.mcnemar_p(6, 0) == pytest.approx(2 / 64)
    assert pair.mcnemar_p(1, 9) == pytest.approx(2 * 11 / 1024)


def test_the_same_episode_with_two_outcomes_is_refused(tmp_path):
    pair = _script()
    one = _write(tmp_path / "one.json", [_episode(0, "ar", True)])
    other = _write(tmp_path / "other.json", [_episode(0, "ar", False)])
    with pytest.raises(ValueError, match="differs"):
        pair.load_episodes([one, other])
    assert pair.main([str(one), str(other)]) == 2
    (tmp_path / "bad.json").write_text(json.dumps({"runs": []}))
    assert pair.main([str(tmp_path / "bad.json")]) == 2
