"""bench/ui.py's CI-sized case: it builds its history, the dashboard lists every job of it (those only
the store holds included), the job page draws its rows in the browser, and the figures the docs quote
are in its JSON."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers import REPO


def test_the_dashboard_bench_runs_and_writes_its_figures(tmp_path):
    out = tmp_path / "ui.json"
    done = subprocess.run([sys.executable, str(REPO / "bench" / "ui.py"), "--jobs", "300", "--store-only", "20",
                           "--rows", "3000", "--requests", "20", "--loads", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["listed"] == 300 + 1 + 20
    assert {"p50_ms", "p95_ms", "max_ms"} <= set(result["api"]) and {"p95_ms"} <= set(result["client_list"])
    assert len(result["page_drawn_ms"]) == 2 and result["page_first_ms"] > 0
