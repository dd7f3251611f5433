#!/usr/bin/env bash
# The main job: installs everything (scripts/setup.sh), then runs the example spiral job in this
# process with `baton run` (file:// storage under ./baton-data). Extra arguments go to `baton run`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec "${BATON_VENV:-.venv}/bin/baton" run examples/spiral.yaml "$@"
