"""The benchmarks' code paths, once each on tiny inputs (seconds; nothing is timed or asserted
about speed: the figures come from running the benches themselves)."""
from __future__ import annotations

import math

import pytest

from bench import checkpoint_stall, loop_overhead
from baton.storage.stores.file_store import FileStore


def test_bare_loop_trains_validates_and_saves_the_best(tmp_path):
    best = loop_overhead.bare_loop(epochs=2, threads=1, out_dir=tmp_path)
    assert math.isfinite(best) and (tmp_path / "best.pt").is_file()


def test_gathered_bare_loop_does_the_same_work_bit_for_bit(tmp_path, monkeypatch):
    """Its batches are the DataLoader's (the same shuffle, the same rows), so it trains the same."""
    per_sample = loop_overhead.bare_loop(epochs=2, threads=1, out_dir=tmp_path)
    passes = []
    iterate = loop_overhead.Gathered.__iter__
    monkeypatch.setattr(loop_overhead.Gathered, "__iter__", lambda self: passes.append(self) or iterate(self))
    assert loop_overhead.bare_loop(epochs=2, threads=1, out_dir=tmp_path, gathered=True) == per_sample
    assert len(passes) == 4  # a training and a validation pass per epoch, gathered


def test_loop_overhead_runs_baton_with_the_same_shape():
    cmd = loop_overhead.command("baton", 7, 1, tmp := __import__("pathlib").Path("/x"), "r")
    assert "loop.epochs=7" in cmd and "checkpoint.every_steps=null" in cmd and "resources.cpu_threads=1" in cmd
    assert str(tmp / "store") in cmd[cmd.index("--storage") + 1]


@pytest.fixture(scope="module")
def tiny():
    return checkpoint_stall.build("tiny")


def test_stall_of_each_method_on_a_tiny_state(tiny, tmp_path):
    row = checkpoint_stall.measure_pause(tiny, FileStore(tmp_path), repeats=1)
    assert row["bytes"] > 0
    assert all(row[f"{m}_s"] > 0 for m in ("baton", "dcp", "sync", "clone"))


@pytest.mark.parametrize("method", ["none", "baton", "dcp", "sync"])
def test_throughput_run_of_each_method(tiny, tmp_path, method):
    store = FileStore(tmp_path)
    assert checkpoint_stall.run_steps(tiny, steps=2, every=1, method=method, store=store) > 0
    assert store.list("jobs/bench-tput/") == []  # cleaned up


@pytest.mark.parametrize("variant", ["baton", "per-sample", "no-tensorboard", "no-job-log", "no-checkpoint"])
def test_each_ablation_variant_runs_the_spiral_job(variant, tmp_path):
    """bench/loop_ablation.py: each variant is a real `baton run` that finishes, without its piece."""
    import os
    import subprocess

    from bench import loop_ablation

    cmd = loop_ablation.command(variant, 2, tmp_path, 1)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=loop_ablation.ROOT,
                          env={**os.environ, "PYTHONPATH": str(loop_ablation.ROOT)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert sum(line.startswith("epoch ") for line in done.stdout.splitlines()) == 2
    attempt = tmp_path / "store" / "jobs" / "ablation" / "attempt-1"
    assert any((attempt / "checkpoints").glob("*.pt")) == (variant != "no-checkpoint")
    assert any((attempt / "logs").glob("*.log")) == (variant != "no-job-log")
    # TensorBoard rows are written once a commit covers them: none without checkpoints either
    assert any((attempt / "tensorboard").glob("events.*")) == (variant in ("baton", "per-sample", "no-job-log"))


def test_sharded_checkpoint_bench_runs_every_mode(tmp_path):
    """bench/sharded_checkpoint.py on a tiny model: 2 ranks per mode, every mode's checkpoints taken."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "sharded.json"
    script = Path(__file__).resolve().parents[2] / "bench" / "sharded_checkpoint.py"
    done = subprocess.run([sys.executable, str(script), "--steps", "4", "--every", "2", "--width", "64", "--layers", "2",
                           "--out", str(out)], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {row["mode"]: row for row in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"none", "baton", "dcp_async", "dcp_sync"}
    assert rows["none"]["taken"] == 0 and rows["dcp_sync"]["taken"] == 2
    assert rows["baton"]["taken"] + rows["baton"]["skipped"] == 2
    assert 1.0 <= rows["baton"]["buffers_vs_shard"] < 1.5  # the shard, its RNG and progress: never the whole model


def test_loop_overhead_fails_loudly_past_its_ratio():
    result = {"steady_ratio": 1.17, "threads": 2}
    assert loop_overhead.verdict(result, 1.10).startswith("FAIL: baton run's epoch costs 1.17x")
    assert loop_overhead.verdict({**result, "steady_ratio": 1.04}, 1.10) is None
    assert loop_overhead.verdict(result, 0) is None


def test_control_plane_bench_finds_every_stopped_lease_and_decides_the_preemption():
    """50 simulated workers for a few seconds: each that stopped renewing is found (and no other), and
    the priority-10 job gets a yield decided. The figures themselves come from running the bench."""
    from bench import control_plane

    row = control_plane.measure(50, seconds=9.0, kills=3)
    detection = row["lease_loss_detection_s"]
    assert (detection["detected"], detection["killed"]) == (3, 3)
    assert row["requeued"] == 3  # no live lease was taken for a lost one
    assert row["preemption_decided_s"] is not None
    assert row["commands_per_s_all"] > 0 and row["reaper_pass_s"]["passes"] > 0
