"""Which files the policy node uses: draft head, router statistics, calibration.

No ROS needed: :mod:`heisd_ros.nodes.policy_decoders` resolves ``model.*`` and builds the
decoder; the node only passes its parameters through. Checked: an empty ``drafter_path``
means the shipped head with the shipped small VLA (and an untrained one, warned, with any
other target); a head trained for another target is refused; ``db_dir`` gives the router
statistics of the task's suite and the calibration, explicit paths override it; a router
method without router statistics runs as drafter SD, warns once and says so on every step.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from heisd_ros import decoder_loader as loader
from heisd_ros.decoding.interface import DRAFT_DRAFTER, DRAFT_NONE, ROUTER_OFF
from heisd_ros.decoding.task_routed import Resolved
from heisd_ros.nodes import policy_decoders as pd
from heisd_ros.nodes.policy_decoders import ModelConfig

SIZE = 32
SUITE, TASK = "piper_goal", "red_block_on_plate"  # red_block_on_plate is only in piper_goal


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(directory, tiny VLA path, its target, a head path without a card)."""
    from heisd_ros.models.checkpoint import load_small_vla, save_draft_head, save_small_vla
    from heisd_ros.models.draft_head import DraftHead, DraftHeadConfig
    from heisd_ros.models.small_vla import SmallVLA
    from heisd_ros.models.small_vla_config import SmallVLAConfig

    root = tmp_path_factory.mktemp("tiny")
    config = SmallVLAConfig(image_size_px=SIZE, patch_size_px=16, vision_dim=32, vision_heads=2,
                            hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128)
    vla_path = save_small_vla(SmallVLA.random(config, seed=1), root / "vla.safetensors",
                              dtype="float32")
    target = load_small_vla(vla_path)
    head = save_draft_head(DraftHead(DraftHeadConfig.for_target(target)),
                           root / "head_nocard.safetensors", target)
    return root, str(vla_path), target, str(head)


def _head_with_card(path: Path, target, card_target: str, fingerprint: str = "") -> str:
    from heisd_ros.models.checkpoint import save_draft_head
    from heisd_ros.models.draft_head import DraftHead, DraftHeadConfig

    card = {"target": card_target}
    if fingerprint:
        card["target_fingerprint"] = fingerprint
    return str(save_draft_head(DraftHead(DraftHeadConfig.for_target(target)), path, target,
                               extra={"card": json.dumps(card)}))


def _router_stats(path: Path, suite: str) -> Path:
    from heisd_ros.kinematics.router import RouterStats

    rng = np.random.default_rng(0)
    ee_path_m = np.cumsum(rng.normal(scale=0.01, size=(32, 3)), axis=0) + [0.3, 0.0, 0.25]
    path.mkdir(parents=True, exist_ok=True)
    out = path / f"router_stats_{suite}.json"
    RouterStats.fit([ee_path_m], window=4, suite=suite).save(out)
    return out


def _calibration(path: Path, fingerprint: str = "") -> Path:
    from heisd_ros.calibration.verify_skip import VerifySkipCalibration

    out = path / "calibration.json"
    VerifySkipCalibration(skip_threshold=0.99, router_threshold=0.5, precision_target=0.9,
                          skip_precision=float("nan"), skip_support=0, skip_rate=0.0,
                          hidden_similarity_threshold=1.0, n_held_out_steps=0, n_pairs=0,
                          model_fingerprint=fingerprint).save(out)
    return out


def _observation(task: str = TASK):
    from heisd_ros.data.observation import EpisodeState, Observation

    image = np.random.default_rng(0).integers(0, 255, (SIZE, SIZE, 3), np.uint8)
    return Observation(image, image, "put the red block on the plate",
                       proprio=np.array([0.3, 0.0, 0.3, 0, 0, 0, 0.07], np.float32),
                       episode=EpisodeState(task))


def _resolve(config: ModelConfig, task: str):
    """The router statistics the node resolves for ``task`` (the loader's rule)."""
    return loader.resolve_router_stats(pd.loader_options(config), task=task)


# ---------------------------------------------------------------- router statistics (db_dir)
def test_db_dir_gives_the_router_statistics_of_the_tasks_suite(tmp_path):
    db = tmp_path / "db"
    goal = _router_stats(db, SUITE)
    _router_stats(db, "piper_spatial")
    config = ModelConfig(db_dir=str(db))
    found = _resolve(config, TASK)
    assert found.path == str(goal) and not found.explicit and SUITE in found.note
    # a task in two suites whose statistics are both there is ambiguous: none, and why
    _router_stats(db, "piper_object")
    ambiguous = _resolve(config, "red_block_in_basket")
    assert ambiguous.path is None and "model.router_stats_path" in ambiguous.note
    # a sim task whose suite the DB lacks: none (not another suite's statistics)
    missing = _resolve(config, "both_blocks_in_basket")
    assert missing.path is None and "piper_long" in missing.note


def test_a_db_of_one_suite_serves_tasks_of_no_sim_suite(tmp_path):
    only = _router_stats(tmp_path / "db", "default")  # heisd-build-db --bag-suite default
    config = ModelConfig(db_dir=str(tmp_path / "db"))
    assert _resolve(config, "wipe_my_table").path == str(only)
    assert _resolve(config, "").path == str(only)  # task not known yet
    assert _resolve(config, TASK).path is None  # piper_goal is not in it


@pytest.mark.parametrize("db_dir, says", [
    ("", "model.db_dir"),
    ("does/not/exist", "not a directory"),
    ("empty", "heisd-build-db writes them"),
])
def test_no_router_statistics_says_why(tmp_path, db_dir, says):
    (tmp_path / "empty").mkdir()
    config = ModelConfig(db_dir=str(tmp_path / db_dir) if db_dir else "")
    found = _resolve(config, TASK)
    assert found.path is None and says in found.note


def test_explicit_paths_override_db_dir(tmp_path):
    db = tmp_path / "db"
    _router_stats(db, SUITE)
    _calibration(db)
    mine = tmp_path / "mine"
    stats, calibration = _router_stats(mine, "piper_long"), _calibration(mine)
    config = ModelConfig(db_dir=str(db), router_stats_path=str(stats),
                         calibration_path=str(calibration))
    assert _resolve(config, TASK) == Resolved(
        str(stats), "model.router_stats_path", explicit=True)
    assert loader.resolve_calibration(pd.loader_options(config)).path == str(calibration)
    assert loader.resolve_calibration(pd.loader_options(ModelConfig(db_dir=str(db)))).path == str(
        db / loader.CALIBRATION_FILE)
    none = loader.resolve_calibration(pd.loader_options(ModelConfig(db_dir=str(mine / "nothing"))))
    assert none.path is None and "heisd-calibrate" in none.note


def test_a_calibration_of_another_model_is_refused(tiny, tmp_path):
    from heisd_ros.retrieval.embedding import model_fingerprint

    _root, _vla, target, _head = tiny
    ours = loader.load_calibration(Resolved(str(_calibration(tmp_path, model_fingerprint(target))),
                                            "model.db_dir"), target)
    assert ours.router_threshold == 0.5
    other = _calibration(tmp_path / "other", "SmallVLA:vla_pooled:0123456789abcdef")
    with pytest.raises(ValueError, match="calibrated for model SmallVLA:vla_pooled:0123"):
        loader.load_calibration(Resolved(str(other), "model.db_dir"), target)


# ---------------------------------------------------------------- draft head
def test_empty_drafter_path_is_the_shipped_head_for_the_shipped_vla():
    from heisd_ros.models import draft_head_choice as head_choice
    from heisd_ros.models.checkpoint import load_small_vla
    from heisd_ros.models.loading import DEFAULT_TARGET_PATH
    from heisd_ros.retrieval.embedding import model_fingerprint

    assert head_choice.SHIPPED_DRAFT_HEAD.is_file() and DEFAULT_TARGET_PATH.is_file()
    target = load_small_vla(DEFAULT_TARGET_PATH)
    # assets agree: the head was trained for these weights (the file's metadata, its gripper
    # rule, was written later, so the file's sha256 is not the one the head's card names)
    shipped = head_choice.SHIPPED_DRAFT_HEAD
    assert head_choice.draft_head_fingerprint(shipped) == model_fingerprint(target)
    warnings = []
    for config in (ModelConfig(), ModelConfig(path=str(DEFAULT_TARGET_PATH))):
        head, description = pd.resolve_draft_head(config, target, warnings.append)
        assert description == f"shipped draft head {head_choice.SHIPPED_DRAFT_HEAD}"
        assert head.config.hidden_size == target.hidden_size and not head.training
    assert warnings == []


def test_the_moving_world_specialist_gets_its_own_shipped_head():
    import json

    from heisd_ros.models import draft_head_choice as head_choice
    from heisd_ros.models.checkpoint import load_small_vla
    from heisd_ros.models.loading import DEFAULT_TARGET_PATH, file_digest
    from heisd_ros.retrieval.embedding import model_fingerprint

    specialist = DEFAULT_TARGET_PATH.with_name("small_vla_dynamic.safetensors")
    head_file = DEFAULT_TARGET_PATH.with_name("draft_head_dynamic.safetensors")
    card = json.loads(DEFAULT_TARGET_PATH.with_name("small_vla_dynamic_card.json").read_text())
    assert file_digest(specialist) == card["sha256"][:16]
    target = load_small_vla(specialist)
    assert model_fingerprint(target) == card["fingerprint"]
    assert model_fingerprint(target) != model_fingerprint(load_small_vla(DEFAULT_TARGET_PATH))
    assert target.gripper_switch_probability == pytest.approx(0.4)
    warnings = []
    head, description = pd.resolve_draft_head(ModelConfig(path=str(specialist)), target,
                                              warnings.append)
    assert description == f"shipped draft head {head_file}" and warnings == []
    assert head_choice.draft_head_fingerprint(head_file) == model_fingerprint(target)
    # the static suites' head is refused for it, and the specialist's for the shipped VLA
    with pytest.raises(ValueError, match="was trained for the target"):
        pd.resolve_draft_head(ModelConfig(path=str(specialist),
                                          drafter_path=str(head_choice.SHIPPED_DRAFT_HEAD)),
                              target)
    shipped = load_small_vla(DEFAULT_TARGET_PATH)
    with pytest.raises(ValueError, match="was trained for the target"):
        pd.resolve_draft_head(ModelConfig(drafter_path=str(head_file)), shipped)


def test_empty_drafter_path_with_another_target_is_an_untrained_head_and_warns(tiny,
                                                                             monkeypatch):
    from heisd_ros.retrieval import embedding

    _root, vla, target, _head = tiny
    fingerprinted = []
    hash_weights = embedding.model_fingerprint
    monkeypatch.setattr(embedding, "model_fingerprint",
                        lambda t: fingerprinted.append(t) or hash_weights(t))
    warnings = []
    head, description = pd.resolve_draft_head(ModelConfig(path=vla), target, warnings.append)
    # every shipped head was tried; the target's weights were hashed once for all of them
    assert fingerprinted == [target]
    assert description.startswith("untrained draft head") and "shipped" in description
    assert warnings == [description] and head.config.hidden_size == target.hidden_size
    # the shipped head's target as the user knows it, never the training run's path in its card
    from heisd_ros.models.draft_head_choice import SHIPPED_DRAFT_HEAD, draft_head_target

    shipped_sha = draft_head_target(SHIPPED_DRAFT_HEAD)[0]
    assert shipped_sha and "runs/" not in description, description
    assert ("the shipped draft head is for the shipped small VLA (heisd_ros/assets/"
            f"small_vla.safetensors, sha256 {shipped_sha}), the target is {vla} (sha256 "
            in description), description


def test_a_draft_head_for_another_target_is_refused(tiny, tmp_path):
    from heisd_ros.models.loading import file_digest

    _root, vla, target, nocard = tiny
    mine = _head_with_card(tmp_path / "mine.safetensors", target,
                           f"/runs/vla.safetensors (sha256 {file_digest(vla)})")
    _head, description = pd.resolve_draft_head(ModelConfig(path=vla, drafter_path=mine), target)
    assert "trained for this target" in description
    # the target by its file name and sha256: the card's path (a training run's) is not shown
    other = _head_with_card(tmp_path / "other.safetensors", target,
                            "runs/s3/old_vla.safetensors (sha256 00112233aabbccdd)")
    with pytest.raises(ValueError, match=r"model.drafter_path: .*other.safetensors was trained "
                                         r"for the target old_vla.safetensors \(sha256 "
                                         r"00112233aabbccdd\), but the loaded target is ") as error:
        pd.resolve_draft_head(ModelConfig(path=vla, drafter_path=other), target)
    assert "runs/" not in str(error.value).replace(str(tmp_path), ""), error.value
    # another file, the same weights (a metadata-only change of the target): taken
    from heisd_ros.retrieval.embedding import model_fingerprint

    same_weights = _head_with_card(tmp_path / "same.safetensors", target,
                                   "/runs/vla.safetensors (sha256 00112233aabbccdd)",
                                   fingerprint=model_fingerprint(target))
    _head, description = pd.resolve_draft_head(
        ModelConfig(path=vla, drafter_path=same_weights), target)
    assert "trained for this target" in description
    other_weights = _head_with_card(tmp_path / "other_w.safetensors", target,
                                    "/runs/old_vla.safetensors (sha256 00112233aabbccdd)",
                                    fingerprint="SmallVLA:vla_pooled:0123456789abcdef")
    with pytest.raises(ValueError, match="other_w.safetensors was trained for the target"):
        pd.resolve_draft_head(ModelConfig(path=vla, drafter_path=other_weights), target)
    # a head for the shipped small VLA (an old card: the training run's path, then the rule)
    from heisd_ros.models.loading import DEFAULT_TARGET_PATH

    shipped_sha = file_digest(DEFAULT_TARGET_PATH)
    for_shipped = _head_with_card(
        tmp_path / "for_shipped.safetensors", target,
        f"runs/s15/p4_p04.safetensors (sha256 {shipped_sha}), gripper switches at P >= 0.4")
    with pytest.raises(ValueError) as error:
        pd.resolve_draft_head(ModelConfig(path=vla, drafter_path=for_shipped), target)
    message = str(error.value)
    assert ("for_shipped.safetensors was trained for the target the shipped small VLA "
            f"(heisd_ros/assets/small_vla.safetensors, sha256 {shipped_sha}), but the loaded "
            f"target is {vla} (sha256 {file_digest(vla)})") in message, message
    assert "runs/" not in message.replace(str(tmp_path), ""), message
    # a head whose card does not name its target is taken as it is (and says so)
    _head, description = pd.resolve_draft_head(ModelConfig(path=vla, drafter_path=nocard), target)
    assert "not checked" in description


# ---------------------------------------------------------------- router methods, degraded
def test_heisd_without_a_db_runs_as_drafter_sd_and_says_so(tiny):
    _root, vla, target, head = tiny
    warnings = []
    decoder = pd.build_decoder("heisd", target, ModelConfig(path=vla, drafter_path=head),
                               warn=warnings.append)
    assert decoder.degraded.startswith("heisd runs as drafter SD: no router statistics")
    assert decoder.description.startswith(decoder.degraded)
    assert warnings == [decoder.degraded]  # loud at configure time, once
    decoder.begin_episode(TASK)
    step = decoder.decode(_observation())
    assert step.fields["status"].startswith("heisd runs as drafter SD")
    assert step.fields["router_mode"] == ROUTER_OFF and step.gripper_from_target
    assert step.fields["draft_source"] in (DRAFT_DRAFTER, DRAFT_NONE)
    decoder.decode(_observation())
    assert len(warnings) == 1


def test_heisd_with_a_db_dir_routes_with_the_suites_statistics(tiny, tmp_path):
    _root, vla, target, head = tiny
    db = tmp_path / "db"
    _router_stats(db, SUITE)
    _calibration(db)
    warnings = []
    decoder = pd.build_decoder("router_only", target,
                               ModelConfig(path=vla, drafter_path=head, db_dir=str(db)),
                               warn=warnings.append)
    assert decoder.decoder.current is None  # chosen per task
    decoder.begin_episode(TASK)
    assert decoder.degraded == "" and f"router_stats_{SUITE}.json" in decoder.description
    assert "calibration.json" in decoder.description
    step = decoder.decode(_observation())
    assert "drafter SD" not in step.fields["status"]
    assert decoder.decoder.current.config.router.threshold == 0.5  # the DB's calibration
    # an episode of a suite the DB has no statistics for: drafter SD, said once
    decoder.begin_episode("block_left_of_plate")
    assert "piper_spatial" in decoder.degraded and warnings == [decoder.degraded]
    assert decoder.decode(_observation("block_left_of_plate")).fields["status"].startswith(
        "router_only runs as drafter SD")
    decoder.begin_episode(TASK)  # and back
    assert decoder.degraded == ""


@pytest.mark.parametrize("method, n, want", [("heisd", -1, 2), ("heisd", 0, 0),
                                             ("heisd_paper", -1, 2), ("heisd_paper", 4, 4)])
def test_the_unverified_run_parameter_reaches_the_decoder(tiny, tmp_path, method, n, want):
    _root, vla, target, head = tiny
    db = tmp_path / "db"
    _router_stats(db, SUITE)
    _calibration(db)
    decoder = pd.build_decoder(method, target, ModelConfig(path=vla, drafter_path=head,
                                                           db_dir=str(db), max_unverified_run=n))
    decoder.begin_episode(TASK)
    unverified = decoder.decoder.current.config.unverified
    assert (unverified.paper_max_run if method == "heisd_paper" else unverified.max_run) == want
    with pytest.raises(ValueError, match="max_unverified_run"):
        ModelConfig(max_unverified_run=-2)


@pytest.mark.parametrize("similarity, want", [(-1.0, 0.90), (0.95, 0.95)])
def test_the_follow_similarity_parameter_reaches_the_decoder(tiny, tmp_path, similarity, want):
    _root, vla, target, head = tiny
    db = tmp_path / "db"
    _router_stats(db, SUITE)
    _calibration(db)
    decoder = pd.build_decoder("heisd", target, ModelConfig(
        path=vla, drafter_path=head, db_dir=str(db), follow_min_similarity=similarity))
    decoder.begin_episode(TASK)
    assert decoder.decoder.current.config.unverified.follow_min_similarity == want
    with pytest.raises(ValueError, match="follow_min_similarity"):
        ModelConfig(follow_min_similarity=1.5)


def test_the_acceptance_tolerance_parameters_reach_the_decoder(tiny, tmp_path):
    from heisd_ros.decoding.retrieval_accept import GroupAcceptConfig

    _root, vla, target, head = tiny
    db = tmp_path / "db"
    _router_stats(db, SUITE)
    _calibration(db)
    for token, group, want in ((-1, -1, GroupAcceptConfig()),
                               (5, 10, GroupAcceptConfig(token_max_bins=5, group_sum_max_bins=10))):
        decoder = pd.build_decoder("heisd_behind", target, ModelConfig(
            path=vla, drafter_path=head, db_dir=str(db), accept_token_max_bins=token,
            accept_group_sum_max_bins=group))
        decoder.begin_episode(TASK)
        assert decoder.decoder.current.config.group_accept == want
    with pytest.raises(ValueError, match="^model.accept_token_max_bins: token_max_bins"):
        ModelConfig(accept_token_max_bins=300)


def test_explicit_router_statistics_that_do_not_load_fail_the_configure_step(tiny, tmp_path):
    _root, vla, target, head = tiny
    config = ModelConfig(path=vla, drafter_path=head,
                         router_stats_path=str(tmp_path / "router_stats_x.json"))
    with pytest.raises(OSError):
        pd.build_decoder("heisd", target, config)


def test_gripper_rule_parameter(tiny):
    _root, vla, _target, _head = tiny
    target, description = pd.load_target(ModelConfig(path=vla, gripper_switch_prob="0.4"))
    assert target.gripper_switch_probability == 0.4 and "P >= 0.4" in description
    target, description = pd.load_target(ModelConfig(path=vla, gripper_switch_prob="none"))
    assert target.gripper_switch_probability is None and "P >=" not in description
    assert pd.load_target(ModelConfig(path=vla))[0].gripper_switch_probability is None
    with pytest.raises(ValueError, match="gripper_switch_prob"):
        ModelConfig(gripper_switch_prob="2")
