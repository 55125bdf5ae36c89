"""The package as a ROS 2 user and a pip user meet it: manifest, entry points, ROS-free imports."""

from __future__ import annotations

import importlib
import os
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Modules that may import ROS (the node layer); everything else must import without it.
ROS_LAYER = ("heisd_ros.nodes", "heisd_ros.msg", "heisd_ros.srv")


def test_package_xml_is_valid_for_catkin_pkg():
    catkin_pkg = pytest.importorskip("catkin_pkg.package")
    package = catkin_pkg.parse_package(str(ROOT / "package.xml"))
    package.validate()
    assert package.name == "heisd_ros"
    assert package.get_build_type() == "ament_cmake"
    assert "rosidl_interface_packages" in [g.name for g in package.member_of_groups]
    depends = {d.name for d in package.build_depends + package.exec_depends}
    assert {"rclpy", "std_msgs", "geometry_msgs", "sensor_msgs", "nav_msgs",
            "visualization_msgs", "rosidl_default_runtime"} <= depends


def test_interface_files_are_all_built():
    cmake = (ROOT / "CMakeLists.txt").read_text()
    for path in sorted((ROOT / "msg").glob("*.msg")) + sorted((ROOT / "srv").glob("*.srv")):
        assert f'"{path.parent.name}/{path.name}"' in cmake, f"{path.name} missing in CMakeLists"


def _library_modules() -> list[str]:
    import heisd_ros

    names = []
    for info in pkgutil.walk_packages([str(ROOT / "heisd_ros")], prefix="heisd_ros."):
        if not info.name.startswith(ROS_LAYER):
            names.append(info.name)
    assert heisd_ros.__version__
    return names


_BLOCKER = textwrap.dedent("""
    import importlib.abc, sys
    BLOCKED = {blocked!r}
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{{name}} is blocked: this module must import without it")
            return None
    sys.meta_path.insert(0, Block())
    import importlib
    for name in {modules!r}:
        importlib.import_module(name)
    print("imported", len({modules!r}))
""")


def _import_with_blocked(modules: list[str], blocked: set[str]) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env["PYTHONPATH"] = str(ROOT)
    code = _BLOCKER.format(blocked=sorted(blocked), modules=modules)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"imported {len(modules)}" in result.stdout


def test_library_imports_without_ros():
    modules = _library_modules()
    assert "heisd_ros.data.observation" in modules
    _import_with_blocked(modules, {"rclpy", "rosidl_runtime_py", "rosidl_parser", "launch",
                                   "launch_ros", "cv_bridge", "rosbag2_py", "sensor_msgs",
                                   "geometry_msgs", "std_msgs"})


def test_retrieval_and_router_import_without_torch():
    modules = [m for m in _library_modules()
               if m.startswith(("heisd_ros.retrieval", "heisd_ros.kinematics"))]
    _import_with_blocked(modules + ["heisd_ros.data.observation"], {"torch", "transformers"})


def test_console_scripts_resolve():
    from importlib.metadata import distributions

    # Not importlib.metadata.entry_points(): it keeps one distribution per name, and the colcon
    # install space holds a second heisd_ros (the interfaces' egg-info, without scripts).
    scripts = [ep for dist in distributions() if dist.metadata["Name"] == "heisd_ros"
               for ep in dist.entry_points
               if ep.group == "console_scripts" and ep.name.startswith("heisd-")]
    assert scripts, "heisd_ros is not pip-installed (pip install -e .)"
    for ep in scripts:
        module = importlib.import_module(ep.module)
        assert callable(getattr(module, ep.attr)), f"{ep.name}: {ep.value} is not callable"


@pytest.mark.timeout(900)
def test_plain_pip_install_without_ros(tmp_path):
    """A venv with nothing but `pip install <repo>`: the library imports, ROS is absent."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    install = subprocess.run([str(py), "-m", "pip", "install", "-q", str(ROOT)],
                             capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr[-3000:]
    check = subprocess.run(
        [str(py), "-c", "import importlib.util as u, heisd_ros, heisd_ros.data.observation as o;"
         "assert u.find_spec('rclpy') is None; print(o.ACTION_DIM)"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert check.returncode == 0, check.stderr
    assert check.stdout.strip() == "7"
