#!/usr/bin/env bash
# The test command: installs everything (scripts/setup.sh, and a headless browser for the dashboard's tests),
# then runs the whole suite.
# Extra arguments go to pytest (e.g. scripts/test.sh -k resume).
# Most tests wait on processes (workers, leases, signals): two pytest-xdist workers (TEST_WORKERS=N to
# change; 0 runs in this process), each test file kept on one of them with its fixtures; the 25 slowest
# tests are listed at the end (the suite should stay under 30 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# the dashboard's tests drive a real browser: Debian's chromium and its chromedriver
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  echo "test: installing chromium and chromium-driver from Debian's packages"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium chromium-driver >/dev/null
fi
exec "${BATON_VENV:-.venv}/bin/python" -m pytest -n "${TEST_WORKERS:-2}" --dist loadfile --durations=25 "$@"
