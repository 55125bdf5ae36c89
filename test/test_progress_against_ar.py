"""scripts/progress_against_ar.py: its table says how far executed actions go along AR's."""

from __future__ import annotations

import pytest

from test.fixtures_scripts import load_script


def _script():
    return load_script("progress_against_ar")


def _row(verified, source, executed, ar):
    return {"suite": "s", "task": "t", "verified": verified, "draft_source": source,
            "target_forwards": 1, "action": [*executed, 0, 0, 0, 1], "ar": [*ar, 0, 0, 0, 1]}


def test_the_table_measures_progress_along_ar_per_kind_of_step():
    table = _script().progress_table([
        _row(True, "", [0.004, 0, 0], [0.004, 0, 0]),                  # AR itself
        _row(False, "retrieval", [0.002, 0.002, 0], [0.004, 0, 0]),    # half along, sideways
        _row(False, "retrieval", [0.002, 0, 0], [0.004, 0, 0]),        # half as far
        {"suite": "s", "task": "t", "successes": 1, "steps": [3]},     # an episode row
    ]).splitlines()
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in table[2:]}
    skipped = rows["retrieved, not verified (checked behind)"]
    assert skipped[1] == "2 (67%)" and skipped[2] == "0%" and skipped[6] == "**0.50** |"
    assert skipped[3] == "4.0" and skipped[4] == "2.4"   # AR 4 mm; 2.83 and 2 mm from it
    assert rows["AR (no draft)"][2] == "100%" and rows["AR (no draft)"][6] == "**1.00** |"
    assert rows["**all**"][6] == "**0.67** |"             # (4 + 2 + 2) / 12
    with pytest.raises(ValueError, match="no steps"):
        _script().progress_table([{"successes": 0, "steps": []}])
