"""heisd-train-drafter: writes safetensors + card, resumes exactly, takes any observation source."""

import json

import pytest
import torch

from heisd_ros.models.checkpoint import load_draft_head, save_small_vla
from heisd_ros.models.loading import file_digest
from heisd_ros.tools import train_drafter
from heisd_ros.training.draft_training import DrafterTrainConfig
from test.fixtures_decoding import scenes


def run(vla, out, steps, resume=False, observations=None):
    config = DrafterTrainConfig(steps=steps, batch_size=4, lr=1e-3, seed=3)
    data = observations if observations is not None else scenes(8, seed=30)
    return train_drafter.train(vla, "tiny", data, scenes(3, seed=31), out, config,
                               checkpoint_every=2, resume=resume, data_description="test",
                               show_progress=False)


def test_writes_head_and_card(tmp_path, tiny_trained_vla):
    card = run(tiny_trained_vla, tmp_path, steps=3)
    written = json.loads((tmp_path / "card.json").read_text())
    assert written == json.loads(json.dumps(card))
    assert written["steps"] == 3 and written["train_rollouts"] == 8 and written["data"] == "test"
    assert written["final_loss"] > 0
    heldout = written["heldout"]
    assert heldout["actions"] == 3 and heldout["lossless_match_rate"] == 1.0
    assert 2 <= heldout["target_forwards_per_action"] <= 7
    head = load_draft_head(tmp_path / "draft_head.safetensors", tiny_trained_vla)
    assert head.config.hidden_size == tiny_trained_vla.hidden_size
    # the head names the weights it fits, so the policy node can match it after the target
    # file's metadata changes
    from heisd_ros.models.draft_head_choice import draft_head_fingerprint
    from heisd_ros.retrieval.embedding import model_fingerprint

    assert draft_head_fingerprint(tmp_path / "draft_head.safetensors") == \
        model_fingerprint(tiny_trained_vla)


def test_resume_continues_exactly(tmp_path, tiny_trained_vla):
    straight = run(tiny_trained_vla, tmp_path / "straight", steps=4)
    run(tiny_trained_vla, tmp_path / "resumed", steps=2)
    card = run(tiny_trained_vla, tmp_path / "resumed", steps=4, resume=True)
    assert card["steps"] == 4
    assert card["final_loss"] == straight["final_loss"]  # the same last step, bit for bit
    a = load_draft_head(tmp_path / "straight" / "draft_head.safetensors", tiny_trained_vla)
    b = load_draft_head(tmp_path / "resumed" / "draft_head.safetensors", tiny_trained_vla)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        torch.testing.assert_close(x, y, msg=name)
    with pytest.raises(FileNotFoundError, match="train_state.pt"):
        run(tiny_trained_vla, tmp_path / "never", steps=2, resume=True)


def test_accepts_any_iterable_of_observations(tmp_path, tiny_trained_vla):
    source = (obs for obs in scenes(5, seed=40))     # a one-shot generator, like a data stream
    card = run(tiny_trained_vla, tmp_path, steps=1, observations=source)
    assert card["train_rollouts"] == 5


def test_cli_entry_point(tmp_path, tiny_trained_vla):
    target = save_small_vla(tiny_trained_vla, tmp_path / "vla.safetensors")
    out = tmp_path / "run"
    code = train_drafter.main(["--out", str(out), "--target", str(target), "--observations", "4",
                               "--heldout", "2", "--steps", "2", "--batch-size", "2"])
    assert code == 0
    card = json.loads((out / "card.json").read_text())
    assert card["steps"] == 2 and "synthetic" in card["data"]
    # the target by file name and sha256: the path given (a run folder here) is not recorded
    assert card["target"] == f"vla.safetensors (sha256 {file_digest(target)})"


@pytest.mark.parametrize("field,value", [("steps", 0), ("batch_size", -1), ("lr", 0.0),
                                         ("ce_weight", -1.0)])
def test_config_errors_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        DrafterTrainConfig(**{field: value})
