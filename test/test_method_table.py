"""The method names are defined once, and every front end defaults to the shipped models.

``heisd_ros.decoding.methods.METHODS`` is the only table of decoding methods: the launch
graph, the policy node's config, heisd-eval, heisd-replay, heisd-record, heisd-bench and the
YAML's comment all expose exactly its names. Without ``--target``/``--drafter``, heisd-eval
and heisd-replay resolve the shipped small VLA and its shipped draft head; any other target
gets an untrained head only with a warning and ``drafter_untrained`` in the description.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest

from heisd_ros.decoding.methods import METHOD_NAMES, METHODS

REPO = Path(__file__).resolve().parents[1]


def test_every_front_end_exposes_exactly_the_tables_names():
    from heisd_ros.decoding import hybrid
    from heisd_ros.eval import methods as eval_methods
    from heisd_ros.nodes import graph
    from heisd_ros.nodes.policy_config import PolicyNodeConfig
    from heisd_ros.tools import bench
    from heisd_ros.tools import eval as eval_tool

    assert graph.METHODS == METHOD_NAMES and hybrid.METHODS is METHODS
    assert eval_methods.METHODS is METHODS
    assert eval_methods.check_methods(METHOD_NAMES) == list(METHOD_NAMES)
    for name in METHOD_NAMES:
        assert PolicyNodeConfig(method=name).method == name
    with pytest.raises(ValueError, match="valid: " + ", ".join(METHOD_NAMES)):
        PolicyNodeConfig(method="eagle")
    args = bench.parse_args(["decode", "--db", "x", "--methods", ",".join(METHOD_NAMES)])
    assert bench.decode_methods(args) == list(METHOD_NAMES)
    with pytest.raises(ValueError, match="--methods: unknown method 'eagle'"):
        bench.decode_methods(bench.parse_args(["decode", "--methods", "ar,eagle"]))
    help_text = eval_tool.build_parser().format_help()
    assert all(name in help_text for name in METHOD_NAMES)
    yaml_text = (REPO / "config" / "policy_node.yaml").read_text(encoding="utf-8")
    comment = re.search(r"# a name of .*?METHODS.*?:(.*?)\.\n", yaml_text, re.S).group(1)
    assert tuple(n.strip(" #\n") for n in comment.split("|")) == METHOD_NAMES


def _name_literals(path: Path):
    """(line, names) of every tuple/list/set/dict literal of method names in ``path``."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        items = (node.keys if isinstance(node, ast.Dict)
                 else node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [])
        names = {k.value for k in items if isinstance(k, ast.Constant) and k.value in METHODS}
        if len(names) >= 4:
            yield node.lineno, sorted(names)


def test_the_method_list_is_written_once():
    table = REPO / "heisd_ros" / "decoding" / "methods.py"
    copies = [(str(p.relative_to(REPO)), line, names)
              for root in ("heisd_ros", "launch") for p in sorted((REPO / root).rglob("*.py"))
              if p != table for line, names in _name_literals(p)]
    assert copies == []
    assert list(_name_literals(table))  # the table itself is found by the same scan


def test_the_table_imports_without_torch():
    import subprocess
    import sys

    code = ("import sys, heisd_ros.nodes.graph, heisd_ros.decoding.methods; "
            "assert 'torch' not in sys.modules and 'numpy' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


@pytest.mark.parametrize("tool", ["eval", "replay"])
def test_eval_and_replay_default_to_the_shipped_model_and_head(tool):
    from heisd_ros.eval.methods import context_from_args
    from heisd_ros.models.draft_head_choice import SHIPPED_DRAFT_HEAD
    from heisd_ros.models.loading import DEFAULT_TARGET_PATH
    from heisd_ros.tools import eval as eval_tool
    from heisd_ros.tools import replay as replay_tool

    parser = {"eval": eval_tool, "replay": replay_tool}[tool].build_parser()
    args = parser.parse_args(["--suites", "piper_goal"] if tool == "eval" else ["some_bag"])
    assert args.target is None and args.drafter is None and "drafter" in args.methods
    warnings = []
    _ctx, desc = context_from_args(args, args.methods, warn=warnings.append)
    assert desc["target"].startswith(str(DEFAULT_TARGET_PATH))
    assert desc["drafter"] == f"shipped draft head {SHIPPED_DRAFT_HEAD}"
    assert desc["drafter_untrained"] is False and warnings == []


def test_another_target_without_a_drafter_gets_a_flagged_untrained_head(tmp_path):
    from heisd_ros.eval.methods import make_context
    from heisd_ros.models.checkpoint import save_small_vla
    from heisd_ros.models.small_vla import SmallVLA
    from heisd_ros.models.small_vla_config import SmallVLAConfig

    config = SmallVLAConfig(image_size_px=32, patch_size_px=16, vision_dim=32, vision_heads=2,
                            hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128)
    vla = save_small_vla(SmallVLA.random(config, seed=1), tmp_path / "vla.safetensors",
                         dtype="float32")
    warnings = []
    ctx, desc = make_context(["ar", "drafter"], target_path=str(vla), warn=warnings.append)
    assert desc["drafter_untrained"] is True and ctx.resources.draft_head is not None
    assert desc["drafter"].startswith("untrained draft head") and warnings == [desc["drafter"]]
    _ctx, desc = make_context(["ar", "retrieval"], target_path=str(vla),
                             warn=warnings.append)
    assert desc["drafter"] is None and desc["drafter_untrained"] is False  # no head needed


@pytest.mark.parametrize("tool", ["eval", "replay", "record"])
def test_the_retrieval_deadline_option_reaches_every_hybrid_decoder(tool, tmp_path):
    from heisd_ros.decoding.retrieval_source import RetrievalSourceConfig
    from heisd_ros.eval.methods import build_method, context_from_args
    from heisd_ros.tools import eval as eval_tool
    from heisd_ros.tools import record as record_tool
    from heisd_ros.tools import replay as replay_tool
    from test.test_hybrid_helpers import ScriptedClient, ok

    module = {"eval": eval_tool, "replay": replay_tool, "record": record_tool}[tool]
    first = {"eval": ["--suites", "piper_goal"], "replay": ["some_bag"],
             "record": ["--suite", "piper_goal", "--task", "t", "--out", str(tmp_path)]}[tool]
    parser = module.build_parser()
    for option, want_s in (([], RetrievalSourceConfig().deadline_s),
                           (["--retrieval-deadline-ms", "0"], 0.0),
                           (["--retrieval-deadline-ms", "12.5"], 0.0125)):
        args = parser.parse_args(first + option)
        ctx, _ = context_from_args(args, ["ar", "retrieval"])
        ctx.db = ScriptedClient(lambda _embedding: ok([]))  # any retrieval client
        decoder = build_method("retrieval", ctx)
        assert decoder.retrieval.config.deadline_s == pytest.approx(want_s)
    args = parser.parse_args(first + ["--retrieval-deadline-ms", "-1"])
    with pytest.raises(ValueError, match="--retrieval-deadline-ms"):
        context_from_args(args, ["ar", "retrieval"])


@pytest.mark.parametrize("tool", ["eval", "replay"])
def test_the_skip_threshold_option_overrides_the_calibration(tool, tmp_path):
    from heisd_ros.calibration.verify_skip import VerifySkipCalibration
    from heisd_ros.eval.methods import build_method, context_from_args
    from heisd_ros.kinematics.router import MODE_RETRIEVAL
    from heisd_ros.tools import eval as eval_tool
    from heisd_ros.tools import replay as replay_tool
    from test.test_hybrid_helpers import ScriptedClient, ok

    calibration = tmp_path / "calibration.json"
    VerifySkipCalibration(skip_threshold=1.0, router_threshold=0.2, precision_target=0.95,
                          skip_precision=float("nan"), skip_support=0, skip_rate=0.0,
                          hidden_similarity_threshold=1.0, n_held_out_steps=0,
                          n_pairs=0).save(calibration)
    stats = tmp_path / "router_stats.json"
    from heisd_ros.kinematics.router import RouterStats

    RouterStats(0.0, 1.0, 0.0, 0.1, window=3).save(stats)
    first = ["--suites", "piper_goal"] if tool == "eval" else ["some_bag"]
    parser = {"eval": eval_tool, "replay": replay_tool}[tool].build_parser()
    for option, want in (([], 1.0), (["--skip-threshold", "0.98"], 0.98)):
        args = parser.parse_args(first + ["--calibration", str(calibration)] + option)
        ctx, _ = context_from_args(args, ["ar", "heisd"])
        ctx.db, ctx.resources.router_stats = ScriptedClient(lambda _e: ok([])), str(stats)
        decoder = build_method("heisd", ctx)
        assert decoder.skip_threshold == pytest.approx(want)
        assert decoder.router.config.threshold == pytest.approx(0.2)  # still the calibration's
    args = parser.parse_args(first + ["--calibration", str(calibration), "--router-threshold",
                                      "0"])
    ctx, _ = context_from_args(args, ["ar", "heisd"])
    ctx.db, ctx.resources.router_stats = ScriptedClient(lambda _e: ok([])), str(stats)
    decoder = build_method("heisd", ctx)
    assert decoder.router.config.threshold == 0.0 and decoder.skip_threshold == 1.0
    turn = np.linspace(0.0, 0.2, 3)  # slow and curved (1 cm radius): F below the calibration's
    slow = np.stack([0.3 + 0.01 * np.cos(turn), 0.01 * np.sin(turn), np.full(3, 0.2)], axis=1)
    decision = decoder.router.decide(slow)
    assert decision.fused < 0.2 and decision.mode == MODE_RETRIEVAL
    for bad in ("1.5", "-0.1", "nan"):
        args = parser.parse_args(first + ["--router-threshold", bad])
        with pytest.raises(ValueError, match="--router-threshold"):
            context_from_args(args, ["ar", "heisd"])
    for bad in ("1.5", "nan"):
        args = parser.parse_args(first + ["--skip-threshold", bad])
        with pytest.raises(ValueError, match="--skip-threshold"):
            context_from_args(args, ["ar", "heisd"])
    for method, option, want in (("heisd", [], 2), ("heisd_paper", [], 2),
                                 ("heisd", ["--max-unverified-run", "0"], 0),
                                 ("heisd_paper", ["--max-unverified-run", "4"], 4)):
        args = parser.parse_args(first + option)
        ctx, _ = context_from_args(args, ["ar", method])
        ctx.db, ctx.resources.router_stats = ScriptedClient(lambda _e: ok([])), str(stats)
        unverified = build_method(method, ctx).config.unverified
        assert (unverified.paper_max_run if method == "heisd_paper"
                else unverified.max_run) == want
    args = parser.parse_args(first + ["--max-unverified-run", "-1"])
    with pytest.raises(ValueError, match="--max-unverified-run"):
        context_from_args(args, ["ar", "heisd"])
    for option, want in (([], (2, 0.90)), (["--follow-min-similarity", "0.94"], (2, 0.94)),
                         (["--follow-min-similarity", "0.94", "--max-unverified-run", "3"],
                          (3, 0.94))):
        ctx, _ = context_from_args(parser.parse_args(first + option), ["ar", "heisd"])
        ctx.db, ctx.resources.router_stats = ScriptedClient(lambda _e: ok([])), str(stats)
        unverified = build_method("heisd", ctx).config.unverified
        assert (unverified.max_run, unverified.follow_min_similarity) == want
    args = parser.parse_args(first + ["--follow-min-similarity", "1.5"])
    with pytest.raises(ValueError, match="--follow-min-similarity"):
        context_from_args(args, ["ar", "heisd"])


def test_the_router_decides_from_fewer_points_with_router_min_points(tmp_path):
    from heisd_ros.calibration.verify_skip import VerifySkipCalibration
    from heisd_ros.eval.methods import build_method, context_from_args
    from heisd_ros.kinematics.router import RouterStats
    from heisd_ros.tools import eval as eval_tool
    from test.test_hybrid_helpers import ScriptedClient, ok

    calibration, stats = tmp_path / "calibration.json", tmp_path / "router_stats.json"
    VerifySkipCalibration(skip_threshold=1.0, router_threshold=0.2, precision_target=0.95,
                          skip_precision=float("nan"), skip_support=0, skip_rate=0.0,
                          hidden_similarity_threshold=1.0, n_held_out_steps=0,
                          n_pairs=0).save(calibration)
    RouterStats(0.0, 1.0, 0.0, 0.1, window=8).save(stats)
    parser = eval_tool.build_parser()
    first = ["--suites", "piper_goal", "--calibration", str(calibration)]
    straight = np.linspace([0.3, 0.0, 0.2], [0.4, 0.0, 0.2], 8)
    for option, want, decided_from in (([], 0, 8), (["--router-min-points", "5"], 5, 5),
                                       (["--router-min-points", "30"], 8, 8)):
        ctx, _ = context_from_args(parser.parse_args(first + option), ["ar", "heisd"])
        ctx.db, ctx.resources.router_stats = ScriptedClient(lambda _e: ok([])), str(stats)
        router = build_method("heisd", ctx).router
        # the calibration's threshold, the statistics' window, the option's fewest points
        assert (router.config.threshold, router.config.window, router.config.min_points) \
            == (pytest.approx(0.2), 8, want)
        assert np.isnan(router.decide(straight[:decided_from - 1]).fused)
        assert np.isfinite(router.decide(straight[:decided_from]).fused)
    with pytest.raises(ValueError, match="--router-min-points"):
        context_from_args(parser.parse_args(first + ["--router-min-points", "2"]), ["heisd"])
