#!/usr/bin/env bash
# The test command: installs everything (scripts/setup.sh), then runs the whole suite.
# Extra arguments go to pytest (e.g. scripts/test.sh -k resume).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec "${BATON_VENV:-.venv}/bin/python" -m pytest "$@"
