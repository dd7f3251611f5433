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

# A root worker runs each job's code as a user of its own: the venv's Python (and its standard library)
# must be one that any user can read. A python3 under a private home (pyenv in /root) is passed over
# for the system's, where that one is readable.
readable_by_all() {
  "$1" -c '
import os, stat, sys, sysconfig
for path in {os.path.realpath(sys.executable), sysconfig.get_paths()["stdlib"]}:
    parts = path.split(os.sep)
    for i in range(2, len(parts) + 1):
        place = os.sep.join(parts[:i])
        if os.path.isdir(place) and not os.stat(place).st_mode & stat.S_IXOTH:
            sys.exit(1)
' 2>/dev/null
}
if [ ! -x "$VENV/bin/python" ]; then
  PYTHON="${BATON_PYTHON:-python3}"
  if ! readable_by_all "$PYTHON" && [ -x /usr/bin/python3 ] && readable_by_all /usr/bin/python3 \
      && /usr/bin/python3 -c "import venv, ensurepip" 2>/dev/null; then
    echo "setup: $(command -v "$PYTHON") is not readable by other users (jobs run as users of their own): using /usr/bin/python3"
    PYTHON=/usr/bin/python3
  fi
  echo "setup: creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
"$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null \
  || "${PIP[@]}" "torch==2.13.0"
"${PIP[@]}" -e ".[dev]"
