"""bench/code_ship.py's CI-sized case: it runs, the archive it stores is smaller than the directory (its
sources compress), and every figure the docs quote is in its JSON."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers import REPO


def test_the_code_shipping_bench_runs_and_writes_its_figures(tmp_path):
    out = tmp_path / "code_ship.json"
    done = subprocess.run([sys.executable, str(REPO / "bench" / "code_ship.py"), "--mb", "2", "--repeats", "1",
                           "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    [row] = json.loads(out.read_text())["rows"]
    assert row["mb"] >= 2 and row["archive_mb"] < row["mb"]
    assert {"pack_s", "tar_s", "upload_s", "submit_s", "beyond_upload_s", "again_s"} <= set(row)
