#!/usr/bin/env bash
# Line and branch coverage of the baton package over the whole suite, every process the tests start
# included (workers, their forkservers and training processes, `baton run`, the CLI): coverage.py's
# subprocess, fork and os._exit patches (scripts/coverage.rc). A process killed outright (SIGKILL)
# keeps nothing, so the figure is a floor. Prints the report and writes COVERAGE_OUT (JSON totals).
# Extra arguments go to pytest. Run after scripts/setup.sh; it installs coverage into the venv.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${BATON_VENV:-.venv}"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "coverage==7.17.5"
DATA="$(mktemp -d "${TMPDIR:-/tmp}/baton-coverage-XXXXXX")"
RC="$DATA/coverage.rc"
sed -e "s|@DATA@|$DATA|" -e "s|@ROOT@|$PWD|" scripts/coverage.rc > "$RC"
status=0
COVERAGE_RCFILE="$RC" "$VENV/bin/python" -m coverage run --rcfile="$RC" -m pytest -n "${TEST_WORKERS:-3}" \
  --dist loadfile -p no:cacheprovider -q "$@" || status=$?
"$VENV/bin/python" -m coverage combine --rcfile="$RC" -q
"$VENV/bin/python" -m coverage report --rcfile="$RC" | tail -n 3
"$VENV/bin/python" -m coverage json --rcfile="$RC" -q -o "${COVERAGE_OUT:-coverage.json}"
"$VENV/bin/python" -c "import json,sys; t=json.load(open(sys.argv[1]))['totals']; print('lines %d/%d, branches %d/%d, %.2f%% combined' % (t['covered_lines'], t['num_statements'], t['covered_branches'], t['num_branches'], t['percent_covered']))" "${COVERAGE_OUT:-coverage.json}"
echo "pytest exit status: $status (data in $DATA)"
