#!/usr/bin/env bash
# The test command: installs everything (scripts/setup.sh, and a headless browser for the dashboard's tests),
# then runs the whole suite.
# Extra arguments go to pytest (e.g. scripts/test.sh -k resume).
# Three pytest-xdist workers (TEST_WORKERS=N to change; 0 runs in this process), each test file kept on
# one of them with its fixtures: on 2 cores two left the cores idle 18% of the time (tests that wait on a
# lease, a signal, a slow data set) and three keep them busy (96%). The 25 slowest tests are listed at
# the end.
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
exec "${BATON_VENV:-.venv}/bin/python" -m pytest -n "${TEST_WORKERS:-3}" --dist loadfile --durations=25 "$@"
