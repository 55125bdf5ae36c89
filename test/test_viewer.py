"""heisd-view: step kinds, a bag to a .rrd read back through Rerun, heisd-eval --view, no Rerun."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from heisd_ros.viewer.steps import KIND_IDS, accepted_length, status_line, step_kinds
from test.fixtures_viewer import KINDS, STEPS, bag_of

pytest.importorskip("rerun", reason="the view extra (rerun-sdk) is not installed")


def test_step_kinds_resolve_checks_behind_by_their_successor():
    assert step_kinds(STEPS) == KINDS
    assert step_kinds([None]) == ["ar"]
    assert accepted_length(STEPS[1]) == 2.5 and np.isnan(accepted_length(STEPS[0]))
    line = status_line(6, "drafter", STEPS[6])
    assert "drafter, verified" in line and "router drafter" in line
    assert line.endswith("retrieval timeout: drafter mode")


def test_a_bag_becomes_a_recording_with_every_step(tmp_path, capsys):
    from heisd_ros.tools import view
    from heisd_ros.viewer.readback import column_values, entity_rows

    record, bag = bag_of(tmp_path, STEPS)
    out = tmp_path / "episode.rrd"
    assert view.main(["bag", str(bag), "--save", str(out)]) == 0, capsys.readouterr().err
    assert f"{len(STEPS)} steps" in capsys.readouterr().out
    rows = entity_rows(out)
    n = len(STEPS)
    for entity in ("/cameras/third_person", "/cameras/wrist", "/steps/status",
                   *(f"/robot/joints/joint{i}" for i in range(1, 7)), "/robot/joints/gripper"):
        assert rows.get(entity) == n, (entity, rows.get(entity))
    assert any(e.startswith("/robot/piper/visual_geometries/link6") for e in rows)
    # The scalars: one static series style row, then one row per step with a value.
    assert rows["/metrics/latency_ms"] == 1 + n
    assert rows["/metrics/accepted_length"] == 1 + sum(bool(s["accepted_length_per_round"])
                                                       for s in STEPS)
    # heisd-record's bags log at the stamp: every command is 0 ms old.
    assert column_values(out, "/metrics/command_age_ms", "Scalars:scalars") == [[0.0]] * n
    # The last path drawn colours each step by its resolved kind.
    last = column_values(out, "/world/ee_steps", "Points3D:class_ids")[-1]
    assert last == [KIND_IDS[k] for k in KINDS]
    points = column_values(out, "/world/ee_steps", "Points3D:positions")[-1]
    assert np.allclose(np.asarray(points, float), record.ee_position_m, atol=1e-6)
    texts = column_values(out, "/steps/status", "TextLog:text")
    assert len(texts) == n and texts[6][0].endswith("retrieval timeout: drafter mode")


def test_a_bag_that_is_no_episode_says_why(tmp_path, capsys):
    from heisd_ros.tools import view

    (tmp_path / "empty").mkdir()
    assert view.main(["bag", str(tmp_path / "empty"), "--save", str(tmp_path / "x.rrd")]) == 2
    assert "is not a rosbag2 directory: no metadata.yaml" in capsys.readouterr().err


def test_eval_view_writes_a_recording_per_episode(tiny_target_path, tmp_path, capsys):
    from heisd_ros.tools import eval as eval_tool
    from heisd_ros.viewer.readback import entity_rows

    code = eval_tool.main(["--suites", "piper_goal", "--tasks", "red_block_on_plate",
                           "--episodes", "1", "--max-steps", "3", "--image-size", "32",
                           "--methods", "ar", "drafter", "--target", tiny_target_path,
                           "--view", str(tmp_path / "view")])
    assert code == 0, capsys.readouterr().err
    for method in ("ar", "drafter"):
        path = tmp_path / "view" / "piper_goal" / "red_block_on_plate" / f"{method}_seed0.rrd"
        rows = entity_rows(path)
        assert rows["/steps/status"] == 3 and rows["/cameras/wrist"] == 3, method
        assert rows["/robot/joints/joint3"] == 3 and rows["/metrics/latency_ms"] == 4, method


def test_without_rerun_one_line_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    from heisd_ros.tools import view

    _, bag = bag_of(tmp_path, STEPS[:2])
    monkeypatch.setitem(sys.modules, "rerun", None)   # import rerun raises ImportError
    assert view.main(["bag", str(bag), "--save", str(tmp_path / "x.rrd")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "pip install 'rerun-sdk==0.41.0'" in err and not (tmp_path / "x.rrd").exists()


def test_eval_view_without_rerun_stops_before_any_episode(tmp_path, monkeypatch, capsys):
    from heisd_ros.tools import eval as eval_tool

    monkeypatch.setitem(sys.modules, "rerun", None)
    assert eval_tool.main(["--suites", "piper_goal", "--episodes", "1",
                           "--view", str(tmp_path / "view")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("heisd-eval: --view: ") and "rerun-sdk==0.41.0" in err
    assert not (tmp_path / "view").exists()
