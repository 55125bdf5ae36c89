"""heisd-eval --curve: success against speed over runs that differ in one setting."""

from __future__ import annotations

import json

import pytest

from heisd_ros.tools import eval as eval_tool


def _run(path, n: int, sr: float, speedup: float, seed: int = 100):
    summary = {"ar": {"successes": 20, "episodes": 30, "success_rate": 20 / 30,
                      "sr_wilson95": [0.49, 0.81], "speedup_vs_ar_mean": 1.0,
                      "speedup_vs_ar": 1.0, "unverified_share": 0.0},
               "heisd_ar": {"successes": round(sr * 30), "episodes": 30, "success_rate": sr,
                            "sr_wilson95": [sr - 0.1, sr + 0.1], "speedup_vs_ar_mean": speedup,
                            "speedup_vs_ar": speedup + 0.1, "unverified_share": n / 10}}
    path.write_text(json.dumps({"config": {"seed": seed, "episodes_per_task": 2,
                                           "tasks": ["s/a", "s/b"], "max_unverified_run": n},
                                "suites": {"all": summary}}))
    return str(path)


def test_the_curve_orders_runs_by_the_setting_and_plots_them(tmp_path, capsys):
    runs = [_run(tmp_path / f"n{n}.json", n, sr, x)
            for n, sr, x in ((3, 0.7, 1.9), (0, 0.8, 1.3), (1, 0.8, 1.5))]
    assert eval_tool.main(["--curve", *runs, "--report", str(tmp_path / "out")]) == 0
    lines = [ln.split() for ln in capsys.readouterr().out.splitlines() if "heisd_ar" in ln]
    assert [ln[1] for ln in lines] == ["0", "1", "3"]                # by max_unverified_run
    assert [ln[-3] for ln in lines] == ["1.30x", "1.50x", "1.90x"]   # mean speed-up
    assert [ln[-1] for ln in lines] == ["0.00", "0.10", "0.30"]      # unverified share
    png = tmp_path / "out" / "curve.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| heisd_ar | 3 | 21/30 = 0.70" in (tmp_path / "out" / "curve.md").read_text()


def test_runs_that_cannot_be_compared_are_refused(tmp_path, capsys):
    a = _run(tmp_path / "a.json", 0, 0.8, 1.3)
    b = _run(tmp_path / "b.json", 1, 0.8, 1.5, seed=0)
    assert eval_tool.main(["--curve", a, b]) == 2
    assert "differ in seed" in capsys.readouterr().err
    assert eval_tool.main(["--curve", a, "--curve-key", "nope"]) == 2
    assert "'nope' is not in a run's config" in capsys.readouterr().err
    assert eval_tool.main(["--curve", str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert eval_tool.main(["--methods", "ar"]) == 2
    assert "--suites is required" in capsys.readouterr().err


@pytest.mark.parametrize("n", [0, 2])
def test_one_run_is_a_point_per_method(tmp_path, capsys, n):
    assert eval_tool.main(["--curve", _run(tmp_path / "r.json", n, 0.7, 1.8)]) == 0
    assert len([ln for ln in capsys.readouterr().out.splitlines() if "x " in ln]) == 2
