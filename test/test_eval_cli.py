"""heisd-eval end to end on 1 suite, 1 task, 1 episode, AR + drafter, tiny random VLA."""

from __future__ import annotations

import json

from heisd_ros.tools import eval as eval_tool


def test_eval_json_and_report(tiny_target_path, tmp_path, capsys):
    out = tmp_path / "report"
    code = eval_tool.main(["--suites", "piper_goal", "--tasks", "red_block_on_plate",
                           "--episodes", "1", "--max-steps", "2", "--image-size", "32",
                           "--methods", "drafter", "ar", "--target", tiny_target_path,
                           "--json", str(tmp_path / "e.json"), "--report", str(out)])
    assert code == 0, capsys.readouterr().err
    result = json.loads((tmp_path / "e.json").read_text())
    assert result["config"]["methods"] == ["ar", "drafter"]
    rows = result["suites"]["piper_goal"]
    for name in ("ar", "drafter"):
        row = rows[name]
        assert row["episodes"] == 1 and 0.0 <= row["success_rate"] <= 1.0
        lo, hi = row["sr_wilson95"]
        assert 0.0 <= lo <= row["success_rate"] <= hi <= 1.0
        for key in ("speedup_vs_ar", "al", "target_forwards_per_action", "skip_rate",
                    "router_share", "stage_ms_median", "latency"):
            assert key in row, key
        assert {"p50_ms", "p99_ms"} <= set(row["latency"])
        assert {"vision", "verify", "total"} <= set(row["stage_ms_median"])
        assert set(row["first_goal_progress"]) == {"reached", "grasped", "lifted"}
    assert all(set(e["progress"]) == {"red_block"} for e in result["episodes"])
    assert "How far episodes got" in (out / "report.md").read_text()
    assert rows["ar"]["speedup_vs_ar"] == 1.0 and rows["ar"]["target_forwards_per_action"] == 7.0
    drafter = rows["drafter"]
    assert drafter["drafter_forwards_per_action"] > 0
    # every verification round after the prefill ran the draft head at least once
    assert drafter["drafter_forwards_per_action"] >= drafter["target_forwards_per_action"] - 1
    # Same seeded episodes for both methods.
    assert sorted((e["method"], e["seed"]) for e in result["episodes"]) == [("ar", 0),
                                                                            ("drafter", 0)]
    assert set(result["projection"]["methods"]) == {"ar", "drafter"}
    for name in ("report.md", "trajectories.png", "latency_per_step.png",
                 "accepted_length_hist.png", "sr_vs_speedup.png"):
        assert (out / name).stat().st_size > 0, name
    assert "SR [95% CI]" in capsys.readouterr().out


def test_eval_rejects_unknown_names(capsys):
    assert eval_tool.main(["--suites", "piper_goal", "--methods", "nope"]) == 2
    assert "valid names are" in capsys.readouterr().err
    assert eval_tool.main(["--suites", "piper_goal", "--tasks", "nope", "--episodes", "1"]) == 2
    assert "--tasks" in capsys.readouterr().err


def test_workers_give_the_same_episodes_as_one_process(tiny_target_path, tmp_path, capsys):
    common = ["--suites", "piper_goal", "--tasks", "red_block_on_plate", "blue_block_in_basket",
              "--episodes", "2", "--max-steps", "2", "--image-size", "32", "--methods", "ar",
              "--target", tiny_target_path, "--threads", "1"]
    assert eval_tool.main([*common, "--json", str(tmp_path / "one.json")]) == 0
    capsys.readouterr()
    assert eval_tool.main([*common, "--workers", "2", "--json", str(tmp_path / "two.json")]) == 0
    # the progress bar moves with every episode a worker finishes, not with every task
    bar = capsys.readouterr().err
    assert all(f"| {n}/4 [" in bar for n in range(1, 5)), bar
    one, two = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("one", "two"))
    assert two["config"]["workers"] == 2 and one["config"]["workers"] == 1
    # Same seeded episodes, same order, same outcomes and lengths (greedy decoding, seeded sim).
    assert one["episodes"] == two["episodes"]
    assert eval_tool.main([*common, "--workers", "0"]) == 2
    assert "--workers" in capsys.readouterr().err


def test_worker_jobs_keep_a_task_name_shared_by_two_suites_in_one_process():
    """One DB collection per task name: two processes must never load the same shard."""
    tasks = [("piper_goal", "red_block_in_basket"), ("piper_goal", "stack_blue_on_red"),
             ("piper_object", "red_block_in_basket")]
    assert eval_tool._jobs(tasks) == [
        [("piper_goal", "red_block_in_basket"), ("piper_object", "red_block_in_basket")],
        [("piper_goal", "stack_blue_on_red")]]


def test_eval_gripper_rule_option(tiny_target_path, tmp_path, capsys):
    common = ["--suites", "piper_goal", "--tasks", "red_block_on_plate", "--episodes", "1",
              "--max-steps", "2", "--image-size", "32", "--methods", "ar",
              "--target", tiny_target_path]
    assert eval_tool.main([*common, "--gripper-switch-prob", "0.3",
                           "--json", str(tmp_path / "e.json")]) == 0, capsys.readouterr().err
    result = json.loads((tmp_path / "e.json").read_text())
    assert "gripper switches at P >= 0.3" in result["target"]
    assert eval_tool.main([*common, "--gripper-switch-prob", "1.2"]) == 2
    assert "--gripper-switch-prob: expected a probability in (0, 1)" in capsys.readouterr().err


def test_retrieval_tree_nodes_option_reaches_the_hybrid_decoders(tiny_target_path, capsys):
    from heisd_ros.eval.methods import build_method, make_context

    ctx, _ = make_context(tiny_target_path, None, ["retrieval"], retrieval_tree_nodes=16)
    assert build_method("retrieval", ctx).config.retrieval.tree.node_budget == 16
    default, _ = make_context(tiny_target_path, None, ["retrieval"])
    assert build_method("retrieval", default).config.retrieval.tree.node_budget == 64
    # One action needs 7 nodes: a smaller budget is refused by name, before any episode.
    common = ["--suites", "piper_goal", "--tasks", "red_block_on_plate", "--episodes", "1",
              "--max-steps", "2", "--image-size", "32", "--methods", "heisd",
              "--target", tiny_target_path]
    assert eval_tool.main([*common, "--retrieval-tree-nodes", "5"]) == 2
    assert "--retrieval-tree-nodes: node_budget: expected >= 7" in capsys.readouterr().err
