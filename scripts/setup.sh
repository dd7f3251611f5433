#!/usr/bin/env bash
# Installs what baton needs on a fresh Debian machine: redis-server (for the tests and the demo),
# a virtual environment with torch==2.13.0 FIRST (so nothing pulls a multi-GB CUDA build), then
# baton with its dev extras. Safe to run again: it skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${BATON_VENV:-.venv}"

if ! command -v redis-server >/dev/null 2>&1; then
  echo "setup: installing redis-server from Debian's packages"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV"
  python3 -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
"$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null \
  || "${PIP[@]}" "torch==2.13.0"
"${PIP[@]}" -e ".[dev]"
