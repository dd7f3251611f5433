"""The commit pause (storage/failpoints.py) that tests/helpers.kill_when holds jobs with: a held commit
writes nothing until released; an open gate costs nothing."""
from __future__ import annotations

import subprocess
import sys
import time

from baton.storage import failpoints
from baton.storage.stores.file_store import FileStore
from baton.storage.layout import JobPaths
from tests.helpers import REPO

COMMIT = ("from baton.storage.stores.file_store import FileStore; from baton.storage.layout import JobPaths; "
          "from baton.storage.manifest_store import ManifestStore; "
          "ManifestStore(FileStore({root!r}), JobPaths('held')).update(1, lambda m: None)")


def _commit(root, gate, **popen) -> subprocess.Popen:
    env = {**__import__("os").environ, failpoints.PAUSE_ENV: str(gate)}
    return subprocess.Popen([sys.executable, "-c", COMMIT.format(root=str(root))], env=env, cwd=REPO, **popen)


def test_a_held_commit_writes_nothing_until_released(tmp_path):
    gate, store = tmp_path / "gate", FileStore(tmp_path / "store")
    gate.mkdir()
    proc = _commit(store.root, gate)
    deadline = time.monotonic() + 60
    while not list(gate.glob("commit.held.*")):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.3)
    assert proc.poll() is None and not store.exists(JobPaths("held").manifest)  # waiting, nothing written
    for waiting in gate.glob("commit.held.*"):
        waiting.unlink()
    assert proc.wait(60) == 0 and store.exists(JobPaths("held").manifest)


def test_an_open_gate_lets_every_commit_through(tmp_path):
    gate, store = tmp_path / "gate", FileStore(tmp_path / "store")
    gate.mkdir()
    (gate / "off").touch()
    assert _commit(store.root, gate).wait(60) == 0 and store.exists(JobPaths("held").manifest)
    assert not list(gate.glob("commit.*"))
