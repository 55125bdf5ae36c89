"""Layers point down: inference never imports training, the library never imports the tools.

``heisd_ros.training`` is for ``heisd-train-*``; ``heisd_ros.tools`` holds the command-line
front ends. An AST scan sees every import, lazy ones inside functions included; a subprocess
checks what importing the inference modules actually loads.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "heisd_ros"


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import in ``path``, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _offenders(importer_excluded: tuple[str, ...], imported: str) -> list[str]:
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith(importer_excluded):
            continue
        for line, module in _imports(path):
            if module == imported or module.startswith(imported + "."):
                bad.append(f"{relative}:{line} imports {module}")
    return sorted(set(bad))


def test_inference_never_imports_training():
    assert _offenders(("heisd_ros/training/", "heisd_ros/tools/"), "heisd_ros.training") == []


def test_library_never_imports_the_tools():
    assert _offenders(("heisd_ros/tools/",), "heisd_ros.tools") == []


def test_nodes_do_not_import_each_other():
    """A node module shares constants through a small module (``nodes/qos.py``), not a node."""
    nodes = [p for p in (PACKAGE / "nodes").glob("*_node.py")]
    names = {f"heisd_ros.nodes.{p.stem}" for p in nodes}
    bad = [f"{p.name} imports {module}" for p in nodes for _, module in _imports(p)
           if module in names and module != f"heisd_ros.nodes.{p.stem}"]
    assert bad == []


def test_robot_does_not_import_sim():
    """The robot layer (driver, kinematics, URDF) sits below the simulator, which builds on it."""
    bad = [f"{p.name} imports {module}" for p in sorted((PACKAGE / "robot").rglob("*.py"))
           for _, module in _imports(p) if module.startswith("heisd_ros.sim")]
    assert bad == []


def test_models_do_not_import_decoding():
    """``decoding`` builds on ``models`` (the target, the draft head), never the reverse."""
    bad = [f"{p.name} imports {module}" for p in sorted((PACKAGE / "models").rglob("*.py"))
           for _, module in _imports(p) if module.startswith("heisd_ros.decoding")]
    assert bad == []


_INFERENCE = ("heisd_ros.models.small_vla", "heisd_ros.models.checkpoint",
              "heisd_ros.models.draft_head_choice", "heisd_ros.models.loading",
              "heisd_ros.decoding.builder", "heisd_ros.decoding.hybrid",
              "heisd_ros.eval.methods", "heisd_ros.eval.closed_loop", "heisd_ros.eval.grounding",
              "heisd_ros.retrieval.retriever", "heisd_ros.sim.runner")


def test_importing_inference_loads_no_training_module():
    code = textwrap.dedent(f"""
        import importlib, sys
        for name in {_INFERENCE!r}:
            importlib.import_module(name)
        print(sorted(m for m in sys.modules
                     if m.startswith(("heisd_ros.training", "heisd_ros.tools"))))
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"
