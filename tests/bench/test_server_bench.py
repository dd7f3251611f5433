"""bench/server.py's CI-sized case: a real ``baton server`` and ``baton ui`` over one history, every reader's
status, job and list figures, and submits direct and through the server, in its JSON."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers import REPO


def test_the_server_bench_runs_and_writes_its_figures(tmp_path):
    out = tmp_path / "server.json"
    done = subprocess.run([sys.executable, str(REPO / "bench" / "server.py"), "--jobs", "300", "--requests", "20",
                           "--submits", "4", "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Warning" not in done.stderr, done.stderr
    result = json.loads(out.read_text())
    assert set(result["reads"]) == {"server, member", "server, admin", "ui, no token"}
    assert set(result["reads"]["server, member"]) == {"status", "job", "list"} and set(result["reads"]["ui, no token"]) \
        == {"job", "list"}
    assert {"p50_ms", "p95_ms"} <= set(result["submit"]["server"]) and result["submit_ratio_p50"] > 0
