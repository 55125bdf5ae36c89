"""Hybrid methods through heisd-record, heisd-replay and heisd-eval with a tiny embedded DB.

The DB is built by heisd-build-db from two short scripted episodes in the simulator.

Skipped when the hybrid decoder or the DB builder is not importable.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("heisd_ros.decoding.hybrid")
build_db = pytest.importorskip("heisd_ros.tools.build_db")

from heisd_ros.data.npz_episodes import episode_path, save_episode  # noqa: E402
from heisd_ros.data.rosbag_io import read_bag_messages  # noqa: E402
from heisd_ros.eval.recording import TOPIC_HYBRID_STEP, make_recording_typestore  # noqa: E402
from heisd_ros.tools import eval as eval_tool  # noqa: E402
from heisd_ros.tools import record, replay  # noqa: E402
from test.test_hybrid_helpers import route_all_calibration  # noqa: E402

SUITE, TASK, SIZE = "piper_goal", "red_block_on_plate", "32"


@pytest.fixture(scope="module")
def setup(tiny_target_path, tmp_path_factory):
    from heisd_ros.sim.config import SimConfig
    from heisd_ros.sim.demos import record_expert_episode
    from heisd_ros.sim.env import PiperSimEnv
    from heisd_ros.sim.expert import ScriptedExpert
    from heisd_ros.sim.suites import get_task

    root = tmp_path_factory.mktemp("hybrid")
    config = SimConfig(image_width_px=int(SIZE), image_height_px=int(SIZE))
    with PiperSimEnv(get_task(SUITE, TASK), config) as env:
        expert = ScriptedExpert(env)
        for seed in (0, 1):
            save_episode(record_expert_episode(env, expert, seed, max_steps=8),
                         episode_path(root / "demos", SUITE, TASK, seed))
    assert build_db.main(["--demos", str(root / "demos"), "--db", str(root / "db"),
                          "--target", tiny_target_path, "--router-window", "3", "--exact",
                          "--hold-out-every", "0"]) == 0
    return root, tiny_target_path, str(root / "db")


def test_record_replay_eval_with_hybrid_methods(setup, tmp_path, capsys):
    root, target, db = setup
    common = ["--target", target, "--db", db]
    # Router threshold 0: every step with a full router window drafts from the DB, whatever
    # the random model's motion (skip threshold 1: verification is never skipped).
    always = route_all_calibration(tmp_path / "always_retrieve.json", skip_threshold=1.0)
    assert record.main(["--suite", SUITE, "--task", TASK, "--policy", "heisd", "--max-steps",
                        "4", "--image-size", SIZE, "--out", str(tmp_path / "bags"),
                        "--calibration", str(always), *common]) == 0
    bag = tmp_path / "bags" / SUITE / TASK / "episode_000000_bag"
    steps = [m for _, _, m in read_bag_messages(bag, [TOPIC_HYBRID_STEP],
                                                typestore=make_recording_typestore())]
    assert len(steps) == 4 and {m.router_mode for m in steps} <= {0, 1}
    assert any(m.retrieval_calls for m in steps)

    assert replay.main([str(bag), "--methods", "heisd", "router_only", "--json",
                        str(tmp_path / "r.json"), *common]) == 0
    result = json.loads((tmp_path / "r.json").read_text())
    assert list(result["methods"]) == ["ar", "heisd", "router_only"]
    # Without relaxation or skip the router-only method is lossless.
    assert result["methods"]["router_only"]["agreement_with_ar"]["exact_token_rate"] == 1.0
    assert set(result["methods"]["heisd"]["router_share"]) <= {"drafter", "retrieval"}

    assert eval_tool.main(["--suites", SUITE, "--tasks", TASK, "--episodes", "1", "--max-steps",
                           "3", "--image-size", SIZE, "--methods", "ar", "retrieval", "heisd",
                           "--json", str(tmp_path / "e.json"), *common]) == 0
    rows = json.loads((tmp_path / "e.json").read_text())["suites"][SUITE]
    assert rows["retrieval"]["retrievals_per_action"] == 1.0
    assert "skip_rate" in rows["heisd"] and "router_share" in rows["heisd"]
    capsys.readouterr()


def test_router_method_without_router_stats_is_a_clean_error(setup, capsys):
    _, target, _ = setup
    assert eval_tool.main(["--suites", SUITE, "--tasks", TASK, "--episodes", "1",
                           "--methods", "heisd", "--target", target]) == 2
    assert "router_stats" in capsys.readouterr().err


def test_a_saved_job_reads_back_to_the_same_summary(setup, tmp_path):
    """What an interrupted heisd-eval keeps of a finished task gives the same table."""
    from heisd_ros.eval.closed_loop import summarise_by_suite
    from heisd_ros.eval.job_results import JobResults

    _, target, db = setup
    always = route_all_calibration(tmp_path / "always_retrieve.json", skip_threshold=0.0)
    args = eval_tool.build_parser().parse_args([
        "--suites", SUITE, "--tasks", TASK, "--episodes", "1", "--max-steps", "6",
        "--image-size", SIZE, "--methods", "ar", "heisd", "--target", target, "--db", db,
        "--calibration", str(always)])
    _, runs = eval_tool.run(args)
    table = summarise_by_suite(runs)
    assert table["all"]["heisd"]["retrievals_per_action"] > 0
    store = JobResults(tmp_path / "e.json", "abc")
    store.save(TASK, runs, {"target": "tiny"})
    loaded, desc = store.load(TASK)
    assert desc == {"target": "tiny"} and summarise_by_suite(loaded) == table
    assert JobResults(tmp_path / "e.json", "other").load(TASK) is None  # another run's
    store.path(TASK).write_bytes(b"\x1f\x8b cut short")
    assert store.load(TASK) is None  # a damaged part: the task runs again


def test_checks_behind_through_record_replay_and_eval(setup, tmp_path, capsys):
    """heisd_behind in every front end: each unverified action is checked, the counts say so."""
    _, target, db = setup
    common = ["--target", target, "--db", db]
    skip_all = route_all_calibration(tmp_path / "skip_all.json", skip_threshold=0.0)
    common += ["--calibration", str(skip_all), "--skip-threshold", "0.0"]
    assert record.main(["--suite", SUITE, "--task", TASK, "--policy", "heisd_behind",
                        "--max-steps", "8", "--image-size", SIZE,
                        "--out", str(tmp_path / "bags"), *common]) == 0
    episode = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    bag = tmp_path / "bags" / SUITE / TASK / "episode_000000_bag"
    steps = [m for _, _, m in read_bag_messages(bag, [TOPIC_HYBRID_STEP],
                                                typestore=make_recording_typestore())]
    started = [m.step_index for m in steps if m.checked_behind]
    assert started and all(m.verify_skipped for m in steps if m.checked_behind)
    # Each check's verdict rides on the next step's message; the last one is only counted.
    verdicts = [m.behind_result for m in steps[1:]]
    assert sum(v != 0 for v in verdicts) == len([i for i in started if i < len(steps) - 1])
    assert episode["checked_behind"] == len(started)

    assert replay.main([str(bag), "--methods", "heisd_behind", "--json",
                        str(tmp_path / "r.json"), *common]) == 0
    checks = json.loads((tmp_path / "r.json").read_text())["methods"]["heisd_behind"]["checks"]
    assert checks["checked_behind"] > 0 and checks["unchecked"] == 0
    assert checks["checked_share"] == 1.0

    assert eval_tool.main(["--suites", SUITE, "--tasks", TASK, "--episodes", "1", "--max-steps",
                           "8", "--image-size", SIZE, "--methods", "ar", "heisd",
                           "heisd_behind", "--json", str(tmp_path / "e.json"), *common]) == 0
    rows = json.loads((tmp_path / "e.json").read_text())["suites"][SUITE]
    assert rows["heisd_behind"]["checks"]["checked_share"] == 1.0
    assert rows["heisd_behind"]["checks"]["checked_behind"] > 0
    assert rows["ar"]["checks"]["checked_share"] == 1.0
    assert rows["heisd_behind"]["vla_forwards_per_action"] > \
        rows["heisd_behind"]["target_forwards_per_action"]
    capsys.readouterr()


def test_two_runs_at_a_latency_profile_give_identical_episodes(setup, tmp_path, capsys):
    """Real time at a profile is priced, not timed: the same seeds repeat exactly.

    AR, heisd, heisd_behind (every step may run unverified and is checked behind, so the
    device timeline has checks to wait for) and heisd_deadline (its checks run on a thread of
    their own). With wall-clock latencies the runs differ.
    """
    _, target, db = setup
    skip_all = route_all_calibration(tmp_path / "skip_all.json", skip_threshold=0.0)
    common = ["--suites", SUITE, "--tasks", TASK, "--episodes", "2", "--max-steps", "12",
              "--image-size", SIZE, "--methods", "ar", "heisd", "heisd_behind",
              "heisd_deadline", "--target", target, "--db", db, "--calibration", str(skip_all),
              "--skip-threshold", "0.0", "--real-time", "--latency-profile", "openvla-7b-paper"]
    results = []
    for run in ("a", "b"):
        assert eval_tool.main([*common, "--json", str(tmp_path / run / "e.json")]) == 0, \
            capsys.readouterr().err
        results.append(json.loads((tmp_path / run / "e.json").read_text()))
    a, b = results
    assert a["timing"]["latency_profile"]["name"] == "openvla-7b-paper"
    assert a["config"]["latency_profile"] == "openvla-7b-paper"
    assert a["episodes"] == b["episodes"]
    assert a["config"]["retrieval_deadline_ms"] == 0.0   # a wall-clock deadline depends on load
    for method in ("ar", "heisd", "heisd_behind", "heisd_deadline"):
        assert a["suites"][SUITE][method]["real_time"] == b["suites"][SUITE][method]["real_time"]
    # AR's command age is the paper's step, every time.
    ar = a["suites"][SUITE]["ar"]["real_time"]
    assert ar["command_age_ms"]["p50"] == pytest.approx(ar["command_age_ms"]["p99"])
    # Every command in one kind of decision; AR's are all AR, all late at this profile.
    for method in ("ar", "heisd", "heisd_behind", "heisd_deadline"):
        kinds = a["suites"][SUITE][method]["real_time"]["by_step_kind"]
        commands = sum(e["commands"] for e in a["episodes"] if e["method"] == method)
        assert sum(k["steps"] for k in kinds.values()) == commands > 0
    assert list(ar["by_step_kind"]) == ["AR"] and ar["by_step_kind"]["AR"]["late_share"] == 1.0
    behind = a["suites"][SUITE]["heisd_behind"]
    assert behind["checks"]["checked_behind"] > 0
    assert "device_wait_ms_mean" in behind["real_time"]
    assert a["projection"]["profile"] == "openvla-7b-paper"
