"""A shared pool, measured: how soon a job of higher priority trains when every worker is busy, what the
job that yields to it redoes, and how evenly two teams with equal quotas share the workers.

Real redis-server, S3 endpoint (moto) and two `baton worker` processes on this machine. Measured by
the jobs' own model (``bench.probes.counting_mlp``: every training forward appends the time to a file
per process), not by baton's records:

- **priority**: two priority-0 jobs train on the two workers; a priority-10 job is submitted. *start s*:
  from its submit to its first training forward. *redone*: training forwards of the yielded job
  beyond those of the same job run uninterrupted (the resumed process starts where the yielding one
  committed, so 0 means nothing was trained twice). *others interrupted*: running jobs that yielded
  besides the one needed.
- **fair share**: quotas a=1, b=1 on the two workers; team a submits ``--jobs`` short jobs, then
  team b as many. While both teams have jobs waiting or running (from b's first submit until one team's
  last job ends), each team's slot-seconds (the time its jobs' processes spent between their first and
  last training forward, summed) are compared:
  *share error* is |a - b| / max(a, b). First come, first served would give team a both workers
  until its jobs ran out.

    python bench/pool.py [--trials 3] [--jobs 6] [--long-epochs 6] [--out bench/results/pool.json]

``--trials 1 --jobs 2 --long-epochs 3`` is a CI-sized case (tests/bench).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from baton.jobs.client import JobClient  # noqa: E402
from baton.jobs.services import RedisServer, S3Server, WorkerProcess, stop_workers  # noqa: E402
from bench.probes import counted_in, forwards  # noqa: E402
from bench.loop_overhead import write_result  # noqa: E402
from bench.recovery import poll  # noqa: E402

LONG = {
    "name": "pool", "seed": 5,
    "model": {"target": "bench.probes:counting_mlp", "kwargs": {"in_features": 2, "hidden": 64, "layers": 2,
                                                                  "out_features": 3}},
    "data": {"target": "builtin:spiral", "kwargs": {"n_per_class": 2000}, "batch_size": 64},
    "optimizer": {"name": "adamw", "lr": 1e-3},
    "loop": {"epochs": 6}, "checkpoint": {"every_steps": 50},
}
SHORT_EPOCHS = 2


def spec(directory: Path, epochs: int, **resources) -> dict:
    made = copy.deepcopy(LONG)
    made["model"]["kwargs"]["directory"] = str(directory)
    made["loop"]["epochs"] = epochs
    made["resources"] = resources
    return made


def reference_steps(root: Path, epochs: int) -> int:
    """Training forwards of the long job run uninterrupted (``baton run`` in a process of its own)."""
    import subprocess

    directory = counted_in(root / "reference")
    spec_path = root / "reference.json"
    spec_path.write_text(json.dumps(spec(directory, epochs)))
    subprocess.run([sys.executable, "-m", "baton", "run", str(spec_path), "--id", "reference", "--storage",
                    f"file://{root / 'reference-store'}", "--no-progress"], check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    return sum(len(times) for times in forwards(directory).values())


def priority_trial(client: JobClient, root: Path, index: int, reference: int, epochs: int) -> dict:
    tag = f"{index}-{int(time.time())}"
    dirs = {name: root / f"{name}-{tag}" for name in ("low-a", "low-b", "urgent")}
    for directory in dirs.values():
        counted_in(directory)
    lows = [client.submit(spec(dirs[name], epochs), f"{name}-{tag}") for name in ("low-a", "low-b")]
    for job in lows:
        poll(lambda: (s := job.status()).state.value == "running" and (s.step or 0) >= 20)
    submitted = time.time()
    urgent = client.submit(spec(dirs["urgent"], SHORT_EPOCHS, priority=10), f"urgent-{tag}")
    first = poll(lambda: min((t for times in forwards(dirs["urgent"]).values() for t in times), default=None))
    urgent.wait(timeout=600, progress=False)
    finals = [job.wait(timeout=600, progress=False) for job in lows]
    yielded = [(status, name) for status, name in zip(finals, ("low-a", "low-b")) if status.attempt > 1]
    redone = [sum(len(t) for t in forwards(dirs[name]).values()) - reference for _, name in yielded]
    return {"trial": index, "start_s": first - submitted, "yielded": len(yielded), "redone": redone,
            "events": [status.last_event for status, _ in yielded],
            "succeeded": all(s.state.value == "succeeded" for s in [*finals, urgent.status()])}


def fair_share(client: JobClient, root: Path, jobs: int, epochs: int = SHORT_EPOCHS) -> dict:
    client.set_quota("a", "default", 1)
    client.set_quota("b", "default", 1)
    tag = str(int(time.time()))
    dirs = {}
    submitted = []
    b_arrives = 0.0
    for team in ("a", "b"):
        for n in range(jobs):
            name = f"{team}{n}-{tag}"
            dirs[name] = counted_in(root / name)
            if team == "b" and not n:
                b_arrives = time.time()
            submitted.append(client.submit(spec(dirs[name], epochs, team=team), name))
    finals = [job.wait(timeout=900, progress=False) for job in submitted]
    spans = {name: [(min(t), max(t)) for t in forwards(d).values() if t] for name, d in dirs.items()}
    last_start = {team: max(s for name, runs in spans.items() if name.startswith(team) for s, _ in runs) for team in "ab"}
    first_end = {team: max(e for name, runs in spans.items() if name.startswith(team) for _, e in runs) for team in "ab"}
    window_end = min(first_end.values())  # while both teams had work: from b's first submit until one team's runs out
    window_start = b_arrives
    used = {team: sum(max(0.0, min(e, window_end) - max(s, window_start)) for name, runs in spans.items()
                      if name.startswith(team) for s, e in runs) for team in "ab"}
    error = abs(used["a"] - used["b"]) / max(used.values()) if max(used.values()) > 0 else 0.0
    client.remove_quota("a", "default")
    client.remove_quota("b", "default")
    return {"jobs_per_team": jobs, "slot_s": used, "window_s": window_end - window_start, "share_error": error,
            "last_start": last_start, "reclaimed": [s.last_event for s in finals if s.attempt > 1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=6, help="short jobs per team in the fair-share run")
    parser.add_argument("--epochs", type=int, default=SHORT_EPOCHS, help="epochs of each of those jobs")
    parser.add_argument("--long-epochs", type=int, default=LONG["loop"]["epochs"],
                        help="epochs of the two busy jobs of a priority trial")
    parser.add_argument("--out", default="bench/results/pool.json")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="baton-pool-"))
    redis, s3 = RedisServer().start(), S3Server().start()
    s3.create_bucket("pool")
    env = {**os.environ, **s3.env(), "BATON_REDIS_URL": redis.url, "BATON_STORAGE_URL": "s3://pool/bench",
           "BATON_ALLOWED_MODULES": "bench", "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                                                      os.environ.get("PYTHONPATH")]))}
    os.environ.update(env)
    client = JobClient()
    workers: list[WorkerProcess] = []
    try:
        reference = reference_steps(root, args.long_epochs)
        workers = [WorkerProcess(f"pool-{n}@local", env, str(root / f"w{n}.log")).start() for n in range(2)]
        for worker in workers:
            worker.wait_ready()
        trials = []
        for index in range(args.trials):
            row = priority_trial(client, root, index, reference, args.long_epochs)
            trials.append(row)
            print(f"  priority trial {index}: trained {row['start_s']:.2f}s after submit; {row['yielded']} job(s) "
                  f"yielded, redone {row['redone']}", flush=True)
        share = fair_share(client, root, args.jobs, args.epochs)
    finally:
        stop_workers(workers)
        redis.stop()
        s3.stop()

    print(f"\npriority preemption, 2 busy workers, {args.trials} trial(s) ({os.cpu_count()} cores)")
    print(f"{'trial':>5} {'start s':>8} {'yielded':>8} {'redone':>8}")
    for row in trials:
        print(f"{row['trial']:>5} {row['start_s']:>8.2f} {row['yielded']:>8} {str(row['redone']):>8}")
    starts = [row["start_s"] for row in trials]
    print(f"median start {statistics.median(starts):.2f}s, max {max(starts):.2f}s")
    print(f"\nfair share, quotas a=1 b=1, {args.jobs} jobs of {args.epochs} epoch(s) each (a's submitted first): "
          "slot-seconds while both "
          f"had work: a {share['slot_s']['a']:.1f}, b {share['slot_s']['b']:.1f}; share error {share['share_error']:.1%}")
    write_result({"priority": trials, "start_s_median": statistics.median(starts), "start_s_max": max(starts),
                  "redone_max": max((r for row in trials for r in row["redone"]), default=0), "fair_share": share},
                 args.out)


if __name__ == "__main__":
    main()
