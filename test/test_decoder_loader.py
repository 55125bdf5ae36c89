"""The one loader (``heisd_ros.decoder_loader``) and the one decoder interface.

Checked: a calibration made for another model is refused, by the loader and by heisd-eval
(which used to take it), with a message naming both fingerprints; a matching (or an unmarked)
calibration is applied; options are refused by the name the front end gave them; router
statistics resolve by suite; a plain decode's result has the neutral path fields.
"""

from __future__ import annotations

import pytest

from heisd_ros.decoder_loader import (
    CLI_NAMES,
    DecoderOptions,
    load_resources,
    resolve_router_stats,
)

OTHER_MODEL = "SmallVLA:vla_pooled:0123456789abcdef"


def _calibration(path, fingerprint: str = ""):
    from heisd_ros.calibration.verify_skip import VerifySkipCalibration

    VerifySkipCalibration(skip_threshold=0.97, router_threshold=0.4, precision_target=0.9,
                          skip_precision=float("nan"), skip_support=0, skip_rate=0.0,
                          hidden_similarity_threshold=1.0, n_held_out_steps=0, n_pairs=0,
                          model_fingerprint=fingerprint).save(path)
    return str(path)


def test_the_loader_refuses_a_calibration_of_another_model(tiny_random_vla, tmp_path):
    from heisd_ros.retrieval.embedding import model_fingerprint

    ours = model_fingerprint(tiny_random_vla)
    other = _calibration(tmp_path / "other.json", OTHER_MODEL)
    options = DecoderOptions(calibration_path=other, names=CLI_NAMES)
    with pytest.raises(ValueError) as error:
        load_resources(tiny_random_vla, ["ar", "heisd_ar"], options)
    message = str(error.value)
    assert message.startswith(f"--calibration: {other} was calibrated for model {OTHER_MODEL}")
    assert f"the loaded target is {ours}" in message
    # methods that use no calibration never read it
    assert load_resources(tiny_random_vla, ["ar"], options).resources.calibration is None
    # this model's calibration, or one written before calibrations named their model: taken
    for fingerprint in (ours, ""):
        mine = _calibration(tmp_path / f"mine{len(fingerprint)}.json", fingerprint)
        loaded = load_resources(tiny_random_vla, ["heisd_ar"],
                                DecoderOptions(calibration_path=mine))
        assert loaded.calibration.path == mine and loaded.calibration.explicit
        assert loaded.resources.calibration.router_threshold == 0.4


def test_heisd_eval_refuses_a_calibration_of_another_model(tiny_target_path, tmp_path, capsys):
    from heisd_ros.models.checkpoint import load_small_vla
    from heisd_ros.retrieval.embedding import model_fingerprint
    from heisd_ros.tools import eval as eval_tool

    ours = model_fingerprint(load_small_vla(tiny_target_path))
    other = _calibration(tmp_path / "calibration.json", OTHER_MODEL)
    common = ["--suites", "piper_goal", "--tasks", "red_block_on_plate", "--episodes", "1",
              "--max-steps", "2", "--image-size", "32", "--methods", "heisd_ar",
              "--target", tiny_target_path, "--json", str(tmp_path / "eval.json")]
    assert eval_tool.main([*common, "--calibration", other]) == 2
    err = capsys.readouterr().err
    assert f"heisd-eval: --calibration: {other} was calibrated for model {OTHER_MODEL}" in err
    assert f"the loaded target is {ours}" in err
    assert not (tmp_path / "eval.json").exists()  # refused before any episode ran


@pytest.mark.parametrize("field, value, says", [
    ("skip_threshold", 1.5, "--skip-threshold: expected a cosine similarity in [-1, 1]"),
    ("router_threshold", float("nan"), "--router-threshold: expected a threshold on F"),
    ("retrieval_tree_nodes", 5, "--retrieval-tree-nodes: node_budget: expected >= 7"),
    ("max_unverified_run", -1, "--max-unverified-run: max_run: expected an int >= 0"),
    ("follow_min_similarity", 1.5, "--follow-min-similarity: follow_min_similarity"),
    ("retrieval_deadline_s", -0.001, "--retrieval-deadline-ms: deadline_s"),
    ("accept_token_max_bins", 256, "--accept-token-max-bins: token_max_bins: expected 0..255"),
    ("accept_group_sum_max_bins", -1, "--accept-group-sum-max-bins: group_sum_max_bins"),
    ("accept_token_max_bins", 2.5, "--accept-token-max-bins: expected a whole number"),
])
def test_options_check_themselves_and_say_which_option(field, value, says):
    with pytest.raises(ValueError) as error:
        DecoderOptions(**{field: value}, names=CLI_NAMES)
    assert str(error.value).startswith(says), error.value
    with pytest.raises(ValueError, match=f"^{field}"):   # unnamed: the field's own name
        DecoderOptions(**{field: value})


def test_the_relaxed_acceptance_tolerances_reach_the_hybrid_decoder(tiny_random_vla):
    from heisd_ros.decoding.builder import build_decoder
    from heisd_ros.decoding.retrieval_accept import GroupAcceptConfig

    loaded = load_resources(tiny_random_vla, ["retrieval"],
                            DecoderOptions(accept_token_max_bins=5, accept_group_sum_max_bins=10))
    decoder = build_decoder("retrieval", loaded.resources)
    assert decoder.config.group_accept == GroupAcceptConfig(group_sum_max_bins=10,
                                                            token_max_bins=5)
    one = load_resources(tiny_random_vla, ["retrieval"], DecoderOptions(accept_token_max_bins=4))
    assert build_decoder("retrieval", one.resources).config.group_accept == GroupAcceptConfig(
        token_max_bins=4)   # the other tolerance stays the paper's
    assert "group_accept" not in load_resources(tiny_random_vla, ["heisd"],
                                                DecoderOptions()).resources.options


def test_router_statistics_of_a_suite(tmp_path):
    from heisd_ros.kinematics.router import RouterStats, router_stats_file

    RouterStats(0.0, 1.0, 0.0, 0.1, window=3).save(router_stats_file(tmp_path, "suite_a"))
    options = DecoderOptions(db_dir=str(tmp_path))
    assert resolve_router_stats(options, suite="suite_a").path == str(
        router_stats_file(tmp_path, "suite_a"))
    assert resolve_router_stats(options, suite="suite_b").path is None
    assert resolve_router_stats(options, suite=None).path is None   # a tool without a suite
    explicit = DecoderOptions(db_dir=str(tmp_path), router_stats_path="mine.json")
    assert resolve_router_stats(explicit, suite="suite_a").path == "mine.json"


def test_one_result_type_with_neutral_path_fields(tiny_random_vla):
    from heisd_ros.decoding import hybrid, interface
    from heisd_ros.decoding.builder import DecoderResources, build_decoder
    from heisd_ros.eval.methods import step_record
    from test.fixtures_decoding import scenes

    assert hybrid.ROUTER_OFF is interface.ROUTER_OFF   # the HybridStep constants: one place
    resources = DecoderResources(tiny_random_vla)
    ar, plain = build_decoder("ar", resources), build_decoder("retrieval", resources)
    assert isinstance(ar, interface.Decoder) and isinstance(plain, interface.Decoder)
    obs = scenes(1, seed=3)[0]
    result, routed = ar.decode(obs), plain.decode(obs)
    assert type(result) is type(routed) is interface.ActionResult
    assert result.record is None and result.behind is None and not result.verify_skipped
    assert result.router_mode == interface.ROUTER_OFF and result.status == ""
    fields = result.msg_fields()
    assert fields["draft_source"] == interface.DRAFT_NONE and fields["target_forwards"] == 7
    assert step_record(result)["hybrid"] is None and step_record(routed)["hybrid"] is not None
    assert routed.msg_fields() == routed.record.to_msg_fields()
    assert routed.status.startswith("retrieval absent")
