"""The whole HeiSD path on an OpenVLA checkpoint, through the tools' command lines.

On the tiny random checkpoint in OpenVLA's real layout (``test/openvla_fixtures.py``), named
as a user names a real one (``--model openvla --checkpoint DIR --unnorm-key KEY``) plus
``--vision-specs`` (the tiny backbones' sizes) and, for the closed-loop tools, ``--allow-cpu``
(this machine has no GPU): demonstrations recorded as rosbag2 (``heisd-record``, the scripted
expert), then ``heisd-build-db`` with OpenVLA's embeddings, ``heisd-calibrate``,
``heisd-train-drafter`` from the bags, ``heisd-eval`` and ``heisd-record`` with OpenVLA
deciding, and ``heisd-replay`` of a bag, each for one step or episode.
"""

from __future__ import annotations

import json

import pytest

from heisd_ros.tools import build_db, calibrate, record, replay, train_drafter
from heisd_ros.tools import eval as eval_tool
from test.openvla_fixtures import write_tiny_openvla, write_vision_specs

SUITE, TASK = "piper_goal", "red_block_on_plate"
KEY = "libero_spatial"
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def openvla(tmp_path_factory):
    """The target options of every tool: the tiny checkpoint as a user would give it."""
    root = tmp_path_factory.mktemp("openvla")
    checkpoint = write_tiny_openvla(root / "ckpt")
    specs = write_vision_specs(root / "vision_specs.json")
    return ["--model", "openvla", "--checkpoint", str(checkpoint), "--unnorm-key", KEY,
            "--vision-specs", str(specs)]


@pytest.fixture(scope="module")
def expert_bags(tmp_path_factory):
    """Two short expert episodes of TASK, recorded as heisd-record writes them."""
    out = tmp_path_factory.mktemp("expert_bags")
    assert record.main(["--suite", SUITE, "--task", TASK, "--policy", "expert", "--episodes",
                        "2", "--max-steps", "4", "--image-size", "32", "--out", str(out),
                        "--storage", "sqlite3"]) == 0
    return out


@pytest.fixture(scope="module")
def db(openvla, expert_bags, tmp_path_factory):
    """The DB of OpenVLA embeddings from the bags, one episode held out, and its calibration."""
    path = tmp_path_factory.mktemp("db") / "db"
    assert build_db.main(["--demos", str(expert_bags), "--db", str(path), *openvla,
                          "--router-window", "3", "--hold-out-every", "2", "--exact"]) == 0
    return path


def test_build_db_stores_openvla_embeddings_of_both_cameras(db):
    manifest = json.loads((db / "heisd_db.json").read_text())
    # pooled DINOv2 + SigLIP features of both cameras: 2 x (32 + 48) here, 2 x 2176 = 4352
    # on OpenVLA-7B
    assert manifest["dimension"] == 2 * (32 + 48)
    assert manifest["model_fingerprint"].startswith("OpenVLATarget:")
    assert (db / f"router_stats_{SUITE}.json").is_file()


def test_calibrate_runs_on_openvla(openvla, db, capsys):
    assert calibrate.main(["--db", str(db), *openvla, "--exact", "--max-steps", "1",
                           "--min-support", "1"]) == 0, capsys.readouterr().err
    result = json.loads(capsys.readouterr().out)
    assert result["target"].startswith("OpenVLA ")
    assert result["model_fingerprint"] == json.loads(
        (db / "heisd_db.json").read_text())["model_fingerprint"]
    assert (db / "calibration.json").is_file()


def test_train_drafter_from_recorded_bags(openvla, expert_bags, tmp_path, capsys):
    assert train_drafter.main(["--out", str(tmp_path / "dr"), *openvla, "--demos",
                               str(expert_bags), "--observations", "2", "--heldout", "1",
                               "--steps", "1", "--batch-size", "2"]) == 0
    card = json.loads((tmp_path / "dr" / "card.json").read_text())
    assert card["target"].startswith("OpenVLA ") and card["steps"] == 1
    assert "steps of the demos" in card["data"] and card["train_rollouts"] == 2
    assert card["target_fingerprint"].startswith("OpenVLATarget:")


def test_eval_runs_heisd_on_openvla_with_the_db(openvla, db, tmp_path, capsys):
    """One closed-loop step per method, HeiSD with the OpenVLA DB and its calibration."""
    calibrate.main(["--db", str(db), *openvla, "--exact", "--max-steps", "1",
                    "--min-support", "1"])
    capsys.readouterr()
    code = eval_tool.main(["--suites", SUITE, "--tasks", TASK, "--episodes", "1",
                           "--max-steps", "1", "--image-size", "32", "--methods", "ar", "heisd",
                           *openvla, "--allow-cpu", "--db", str(db),
                           "--retrieval-deadline-ms", "0", "--json", str(tmp_path / "e.json")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads((tmp_path / "e.json").read_text())
    rows = result["suites"][SUITE]
    assert rows["ar"]["target_forwards_per_action"] == 7.0
    assert rows["heisd"]["episodes"] == 1
    assert result["target"].startswith("OpenVLA ") and "cpu, float32" in result["target"]
    assert result["db"] == str(db)
    # no head trained for this target was given: an untrained one, said so
    assert result["drafter_untrained"] and "untrained" in captured.err


def test_record_then_replay_on_openvla(openvla, db, tmp_path, capsys):
    out = tmp_path / "bags"
    code = record.main(["--suite", SUITE, "--task", TASK, "--policy", "drafter", "--episodes",
                        "1", "--max-steps", "1", "--image-size", "32", "--out", str(out),
                        "--storage", "sqlite3", *openvla, "--allow-cpu"])
    assert code == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 1
    bag = out / SUITE / TASK / "episode_000000_bag"
    code = replay.main([str(bag), "--methods", "ar", "drafter", "heisd", *openvla, "--db",
                        str(db), "--retrieval-deadline-ms", "0", "--json",
                        str(tmp_path / "r.json")])
    assert code == 0, capsys.readouterr().err
    result = json.loads((tmp_path / "r.json").read_text())
    assert len(result["frames"]) == 1
    frame = result["frames"][0]["methods"]
    assert frame["drafter"]["agreement"]["exact_token_rate"] == 1.0  # lossless vs AR
    assert set(frame) == {"ar", "drafter", "heisd"}


@pytest.mark.parametrize("tool", ["eval", "record"])
def test_closed_loop_tools_refuse_openvla_on_the_cpu_without_the_opt_in(openvla, tool, tmp_path,
                                                                         capsys):
    common = ["--max-steps", "1", "--image-size", "32", "--episodes", "1", *openvla,
              "--device", "cpu"]
    if tool == "eval":
        code = eval_tool.main(["--suites", SUITE, "--tasks", TASK, "--methods", "ar", *common])
    else:
        code = record.main(["--suite", SUITE, "--task", TASK, "--policy", "ar", "--out",
                            str(tmp_path), *common])
    assert code == 2
    err = capsys.readouterr().err
    assert "OpenVLA on the CPU refused: device 'cpu' was asked for" in err
    assert "--allow-cpu" in err


def test_bench_decode_with_the_openvla_db_of_bags(openvla, db, tmp_path):
    """heisd-bench decode reads the DB's held-out episodes, here rosbag2 ones."""
    from heisd_ros.tools import bench

    args = bench.parse_args(["decode", *openvla, "--db", str(db), "--exact", "--observations",
                             "1", "--warmup", "0", "--methods", "drafter,heisd",
                             "--deadline-ms", "0"])
    modes = bench.run_decode(args)["modes"]
    assert {"ar", "drafter", "heisd"} <= set(modes)
    assert modes["ar"]["target_forwards_per_action"] == 7
    assert modes["drafter"]["agreement_with_ar"]["exact_token_rate"] == 1.0
