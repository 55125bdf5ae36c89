"""The tools take an OpenVLA checkpoint: ``--model openvla --checkpoint DIR``.

The tiny checkpoint's backbones are smaller than the real ones its config names, so the tests
hand the tiny specs in through ``args.openvla_options`` (no command-line flag for that).
"""

from __future__ import annotations

import json

import pytest

from heisd_ros.data.npz_episodes import episode_path, save_episode
from heisd_ros.models.checkpoint import save_draft_head
from heisd_ros.models.draft_head import DraftHead, DraftHeadConfig
from heisd_ros.models.loading import load_target
from heisd_ros.retrieval.embedding import model_fingerprint
from heisd_ros.tools import bench, build_db, train_drafter
from test.fixtures_demos import synth_episode
from test.openvla_fixtures import TINY_VISION, write_tiny_openvla

KEY = "libero_spatial_no_noops"
OPTIONS = {"vision": TINY_VISION}
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_tiny_openvla(tmp_path_factory.mktemp("openvla") / "ckpt")


def _target(checkpoint):
    return load_target(None, model="openvla", checkpoint=str(checkpoint), unnorm_key=KEY,
                       openvla_options=OPTIONS)


def test_load_target_needs_a_checkpoint_directory():
    with pytest.raises(ValueError, match="--checkpoint"):
        load_target(None, model="openvla")
    with pytest.raises(ValueError, match="model"):
        load_target(None, model="gpt")


def test_bench_decode_and_profile_on_openvla(checkpoint, tmp_path):
    target, description = _target(checkpoint)
    assert "OpenVLA" in description
    head = DraftHead(DraftHeadConfig.for_target(target)).eval()
    head_path = save_draft_head(head, tmp_path / "head.safetensors", target)
    args = bench.parse_args(["decode", "--model", "openvla", "--checkpoint", str(checkpoint),
                             "--unnorm-key", KEY, "--drafter", str(head_path),
                             "--observations", "2", "--warmup", "1"])
    args.openvla_options = OPTIONS
    modes = bench.run_decode(args)["modes"]
    assert modes["ar"]["target_forwards_per_action"] == 7
    assert modes["drafter"]["agreement_with_ar"]["exact_token_rate"] == 1.0  # lossless
    args = bench.parse_args(["profile", "--model", "openvla", "--checkpoint", str(checkpoint),
                             "--unnorm-key", KEY, "--repeats", "1"])
    args.openvla_options = OPTIONS
    profile = bench.run_profile(args)
    assert profile["decode_forward_ms"] > 0
    assert "OpenVLA" in profile["target"]
    # the AR estimate is vision + prefill (first token) + six decode forwards
    assert profile["ar_action_ms_estimate"] == pytest.approx(
        profile["vision_ms"] + profile["prefill_ms"] + 6 * profile["decode_forward_ms"])


def test_build_db_embeds_with_openvla(checkpoint, tmp_path):
    demos = tmp_path / "demos"
    for i, task in enumerate(["task_a", "task_b"]):
        save_episode(synth_episode(task, 50 + i, steps=4), episode_path(demos, "s", task, i))
    args = build_db.parse_args(["--demos", str(demos), "--db", str(tmp_path / "db"),
                                "--model", "openvla", "--checkpoint", str(checkpoint),
                                "--unnorm-key", KEY, "--router-window", "3", "--exact",
                                "--hold-out-every", "0"])
    args.openvla_options = OPTIONS
    build_db.build(args)
    target, _ = _target(checkpoint)
    manifest = json.loads((tmp_path / "db" / "heisd_db.json").read_text())
    # Both views through the fused backbone (2 x 2176 = 4352 on the real model).
    features = target.encode(synth_episode("t", 0, 1).observation(0)).vision_features
    assert manifest["dimension"] == features.numel()
    assert manifest["model_fingerprint"] == model_fingerprint(target)


def test_ambiguous_statistics_through_the_tool_are_a_clear_error(checkpoint, tmp_path, capsys):
    demos = tmp_path / "demos"
    save_episode(synth_episode("task_a", 60, steps=3), episode_path(demos, "s", "task_a", 0))
    code = build_db.main(["--demos", str(demos), "--db", str(tmp_path / "db"),
                          "--model", "openvla", "--checkpoint", str(checkpoint),
                          "--hold-out-every", "0"])
    assert code == 2
    err = capsys.readouterr().err
    assert "unnorm_key" in err and KEY in err


def test_train_drafter_on_openvla(checkpoint, tmp_path):
    args = train_drafter.parse_args(["--out", str(tmp_path / "dr"), "--model", "openvla",
                                     "--checkpoint", str(checkpoint), "--unnorm-key", KEY,
                                     "--observations", "4", "--heldout", "2", "--steps", "3",
                                     "--batch-size", "2"])
    args.openvla_options = OPTIONS
    card = train_drafter.run(args)
    assert card["steps"] == 3 and "OpenVLA" in card["target"]
    assert (tmp_path / "dr" / "draft_head.safetensors").is_file()
