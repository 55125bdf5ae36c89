"""heisd-eval end to end on 1 suite, 1 task, 1 episode, AR + drafter, tiny random VLA."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from heisd_ros.tools import eval as eval_tool
from test.node_process import repo_env
from test.polling import wait_until


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
    assert "--methods: unknown method 'nope'; valid: ar, " in capsys.readouterr().err
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
    assert eval_tool._jobs(tasks, 5) == [
        ("red_block_in_basket",
         [("piper_goal", "red_block_in_basket"), ("piper_object", "red_block_in_basket")]),
        ("stack_blue_on_red", [("piper_goal", "stack_blue_on_red")])]


def test_jobs_run_the_longest_first():
    """The last jobs run alone while other workers idle: they should be the short ones."""
    from heisd_ros.sim.suites import get_task, list_tasks

    tasks = [(s, t) for s in ("piper_goal", "piper_long") for t in list_tasks(s)]
    limits = [sum(get_task(s, t).max_steps for s, t in pairs)
              for _, pairs in eval_tool._jobs(tasks, None)]
    assert limits == sorted(limits, reverse=True) and limits[0] > limits[-1]
    # the long suite's tasks come first although they were listed last
    assert eval_tool._jobs(tasks, None)[0][1][0][0] == "piper_long"


def test_an_interrupted_run_resumes_with_the_tasks_it_finished(tiny_target_path, tmp_path,
                                                                capsys, monkeypatch):
    common = ["--suites", "piper_goal", "--tasks", "red_block_on_plate", "blue_block_in_basket",
              "--episodes", "2", "--max-steps", "3", "--image-size", "32",
              "--methods", "ar", "drafter", "--target", tiny_target_path, "--threads", "1"]
    out = tmp_path / "e.json"
    parts = tmp_path / "e.json.parts"
    assert eval_tool.main([*common, "--json", str(tmp_path / "fresh.json")]) == 0
    fresh = json.loads((tmp_path / "fresh.json").read_text())
    assert not (tmp_path / "fresh.json.parts").exists()  # kept only until the results are

    real = eval_tool._run_tasks
    ran: list[str] = []

    def crashing(args, methods, pairs, finished=None):
        ran.append(pairs[0][1])
        if pairs[0][1] == "blue_block_in_basket":
            raise KeyboardInterrupt  # the run is stopped during its second task
        return real(args, methods, pairs, finished)

    monkeypatch.setattr(eval_tool, "_run_tasks", crashing)
    capsys.readouterr()
    assert eval_tool.main([*common, "--json", str(out)]) == 130
    assert f"stopped by Ctrl-C; 1 finished task(s) are kept in {parts}" in \
        capsys.readouterr().err
    assert not out.exists() and [p.name for p in parts.iterdir()] == [
        "red_block_on_plate.json.gz"]

    def counting(args, methods, pairs, finished=None):
        ran.append(pairs[0][1])
        return real(args, methods, pairs, finished)

    monkeypatch.setattr(eval_tool, "_run_tasks", counting)
    ran.clear()
    capsys.readouterr()
    # Other options: nothing is reused.
    assert eval_tool.main([*common, "--seed", "5", "--json", str(out), "--resume"]) == 0
    assert "resuming: 0 of 2 tasks done already" in capsys.readouterr().err
    assert sorted(ran) == ["blue_block_in_basket", "red_block_on_plate"]

    monkeypatch.setattr(eval_tool, "_run_tasks", crashing)
    # interrupted again, with the first options
    assert eval_tool.main([*common, "--json", str(out)]) == 130
    monkeypatch.setattr(eval_tool, "_run_tasks", counting)
    ran.clear()
    capsys.readouterr()
    assert eval_tool.main([*common, "--json", str(out), "--resume"]) == 0
    assert "resuming: 1 of 2 tasks done already" in capsys.readouterr().err
    assert ran == ["blue_block_in_basket"]  # only the unfinished task ran again
    resumed = json.loads(out.read_text())
    # Greedy decoding in a seeded simulator: the same episodes as the uninterrupted run.
    assert resumed["episodes"] == fresh["episodes"]
    assert resumed["config"] == fresh["config"] and not parts.exists()
    for method in ("ar", "drafter"):
        row, ref = resumed["suites"]["all"][method], fresh["suites"]["all"][method]
        assert row["actions"] == ref["actions"] and row["al"] == ref["al"]

    assert eval_tool.main([*common, "--resume"]) == 2
    assert "--resume needs --json" in capsys.readouterr().err


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
    from heisd_ros.decoder_loader import DecoderOptions
    from heisd_ros.eval.methods import build_method, make_context

    ctx, _ = make_context(["retrieval"], DecoderOptions(retrieval_tree_nodes=16),
                          target_path=tiny_target_path)
    assert build_method("retrieval", ctx).config.retrieval.tree.node_budget == 16
    default, _ = make_context(["retrieval"], target_path=tiny_target_path)
    assert build_method("retrieval", default).config.retrieval.tree.node_budget == 64
    # One action needs 7 nodes: a smaller budget is refused by name, before any episode.
    common = ["--suites", "piper_goal", "--tasks", "red_block_on_plate", "--episodes", "1",
              "--max-steps", "2", "--image-size", "32", "--methods", "heisd",
              "--target", tiny_target_path]
    assert eval_tool.main([*common, "--retrieval-tree-nodes", "5"]) == 2
    assert "--retrieval-tree-nodes: node_budget: expected >= 7" in capsys.readouterr().err


def _children(pid: int) -> set[int]:
    """PIDs whose parent is ``pid`` (Linux /proc), multiprocessing's resource tracker aside."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:   # gone meanwhile
            continue
        if int(fields[1]) == pid and b"resource_tracker" not in cmdline:
            found.add(int(stat.parent.name))
    return found


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and is no zombie (an orphan's zombie may wait for its reaper)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] \
            != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("kill", ["SIGTERM", "SIGKILL"])
def test_the_workers_stop_with_the_run(tiny_target_path, tmp_path, kill):
    """A stopped heisd-eval leaves no worker behind (one would hold its DB shards locked)."""
    env = repo_env()
    out = tmp_path / "e.json"
    argv = [sys.executable, "-m", "heisd_ros.tools.eval", "--suites", "piper_goal", "--tasks",
            "red_block_on_plate", "blue_block_in_basket", "--episodes", "50", "--max-steps",
            "300", "--image-size", "32", "--methods", "ar", "--target", tiny_target_path,
            "--threads", "1", "--workers", "2", "--json", str(out)]
    with open(tmp_path / "log.txt", "w+") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                cwd=tmp_path)
        workers: set[int] = set()
        try:
            assert wait_until(lambda: len(_children(proc.pid)) == 2, timeout_s=120), \
                "the two workers never started"
            workers = _children(proc.pid)
            proc.send_signal(getattr(signal, kill))
            code = proc.wait(timeout=120)
            assert wait_until(lambda: not any(_running(w) for w in workers), timeout_s=60), \
                f"workers {workers} outlived the run stopped by {kill}"
        finally:
            if proc.poll() is None:
                proc.kill()
            for pid in filter(_running, workers):   # the test failed: leave nothing running
                os.kill(pid, signal.SIGKILL)
        log.seek(0)
        text = log.read()
    if kill == "SIGTERM":   # it unwinds like Ctrl-C, and says so
        assert code == 143, text
        assert "stopped by SIGTERM; no task had finished" in text, text   # 50 episodes each
    assert not out.exists()
