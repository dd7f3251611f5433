"""bench/search.py's CI-sized case: 9 trials on two real workers, halved by 3 at epochs 1 and 3 of 9, beside
the full grid and Optuna's own pruner over the same points. The search trains at most 40 % of the grid's
steps, its best is within 2 % of the grid's best, and its best trial (paused at two rungs on workers) has
the very best value the grid's uninterrupted run of its point has."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_search_bench_halves_the_compute_and_keeps_the_best(tmp_path):
    out = tmp_path / "search.json"
    done = subprocess.run([sys.executable, str(REPO / "bench" / "search.py"), "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=880, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert {"search_steps", "grid_steps", "search_best", "grid_best", "mode"} <= set(result)
    assert result["mode"] == "min" and result["trials"] == 9
    assert result["search_steps"] <= 0.4 * result["grid_steps"], done.stdout
    assert abs(result["search_best"] - result["grid_best"]) <= 0.02 * abs(result["grid_best"]), done.stdout
    assert result["best_equals_grid_run"], done.stdout
    assert result["search"]["standings"] == {"stopped at epoch 1": 6, "stopped at epoch 3": 2, "finished": 1}
    assert result["asha_steps"] < result["grid_steps"], done.stdout  # (which trials go on depends on timing)
