#!/usr/bin/env bash
# The main job: installs everything (scripts/setup.sh), then `baton demo`: a local redis-server and
# S3 endpoint, two workers, the spiral job, its worker SIGKILLed halfway, the job resumed on the
# other worker, the best model and report fetched into ./demo-out, and a bit-exact check against
# an uninterrupted `baton run`. Extra arguments go to `baton demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec "${BATON_VENV:-.venv}/bin/baton" demo "$@"
