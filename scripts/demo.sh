#!/usr/bin/env bash
# The main job on the embedded default. See README.md for what it does today.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# shellcheck disable=SC1091
. "$ROOT/.heisd-env.sh"
python -m heisd_ros.tools.demo "$@"
