#!/usr/bin/env bash
# The test command: installs everything (scripts/setup.sh), then runs the whole suite.
# Extra arguments go to pytest (e.g. scripts/test.sh -k resume).
# Most tests wait on processes (workers, leases, signals): two pytest-xdist workers (TEST_WORKERS=N to
# change; 0 runs in this process), each test file kept on one of them with its fixtures.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec "${BATON_VENV:-.venv}/bin/python" -m pytest -n "${TEST_WORKERS:-2}" --dist loadfile "$@"
