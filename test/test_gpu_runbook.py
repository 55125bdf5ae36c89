"""docs/GPU_RUNBOOK.md is commands only, and every command in it is accepted as written.

Each ``heisd-*`` line is parsed by that tool's own command line (nothing runs), the
``ros2 launch`` and ``heisd-bringup`` lines go through the launch table
(``heisd_ros.nodes.graph``) to the policy's ``model.*`` parameters, so a renamed option or
launch argument fails here instead of in a user's shell.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from heisd_ros.nodes import graph
from heisd_ros.tools import bench, bringup, build_db, calibrate, record, replay, train_drafter
from heisd_ros.tools import eval as eval_tool

RUNBOOK = Path(__file__).resolve().parents[1] / "docs" / "GPU_RUNBOOK.md"
PARSERS = {
    "heisd-bench": bench.parse_args, "heisd-build-db": build_db.parse_args,
    "heisd-calibrate": calibrate.parse_args, "heisd-train-drafter": train_drafter.parse_args,
    "heisd-eval": lambda argv: eval_tool.build_parser().parse_args(argv),
    "heisd-record": lambda argv: record.build_parser().parse_args(argv),
    "heisd-replay": lambda argv: replay.build_parser().parse_args(argv),
    "heisd-bringup": bringup.parse_args,
}


def commands() -> list[list[str]]:
    """The shell commands of the runbook's bash blocks, variables expanded, as argv lists."""
    text = RUNBOOK.read_text()
    variables, out = {}, []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            assignment = re.fullmatch(r"(\w+)=(\S+|\"[^\"]*\")", line)
            if assignment:
                variables[assignment.group(1)] = assignment.group(2).strip('"')
                continue
            for name, value in sorted(variables.items(), key=lambda kv: -len(kv[0])):
                line = line.replace(f"${name}", value)
            out.append(shlex.split(line))
    return out


def test_the_runbook_has_commands_only():
    text = RUNBOOK.read_text()
    # no Python snippets standing in for a tool
    assert "```python" not in text and "<<" not in text and "from heisd_ros" not in text
    assert "planned" not in text.lower()
    for figure in ("8 ms", "13.93 ms", "5.13 ms"):  # the paper's per-component latencies
        assert figure in text


@pytest.mark.parametrize("tool", sorted(PARSERS))
def test_every_tool_command_of_the_runbook_parses(tool):
    argvs = [argv[1:] for argv in commands() if argv[0] == tool]
    assert argvs, f"the runbook shows no {tool} command"
    for argv in argvs:
        args = PARSERS[tool](argv)
        if tool == "heisd-bringup":
            names = [n for n in graph.LAUNCH_ARGUMENTS if n != "rviz"]
            policy = bringup.node_plan({n: getattr(args, n) for n in names})[0]
            assert policy["spec"].name == "policy_node"
            assert policy["overrides"]["model.type"] == "openvla"
        elif getattr(args, "model", "small") != "openvla":
            # only the expert demonstrations, and the retrieval bench (a DB, no model)
            assert tool == "heisd-record" or argv[0] == "retrieval", argv
        else:
            assert args.checkpoint and args.unnorm_key == "libero_spatial", argv


def test_the_runbook_launch_line_sets_the_openvla_target():
    launches = [argv for argv in commands() if argv[:2] == ["ros2", "launch"]]
    assert launches, "the runbook shows no ros2 launch command"
    for argv in launches:
        assert argv[2:4] == [graph.PACKAGE, "piper_heisd.launch.py"]
        arguments = dict(item.split(":=", 1) for item in argv[4:])
        policy = graph.launch_overrides(arguments)["policy_node"]
        assert policy["model.type"] == "openvla" and policy["model.center_crop"] is True
        assert policy["model.checkpoint"].endswith("openvla-7b-finetuned-libero-spatial")
