"""A search against the full grid and against Optuna's own pruner: compute used and the best metric.

One spec (an MLP on the spiral, 18 epochs, a one-cycle schedule) and a 27-point grid (learning rate x
hidden width x dropout). Three ways through it, side by side in one run on this machine:

- **baton search**: ``baton sweep --search`` with the grid sampler over the same 27 points and
  successive halving by 3 at epochs 2 and 6 (rungs 2, 6, 18), on real ``baton worker`` processes
  (redis-server, moto's S3). Steps counted from the trials' records.
- **baton ASHA**: the same with ``halving.asynchronous`` and as many trials at once as workers: no rung
  waits, so which trials go on (and so its figures) depend on timing.
- **full grid**: every point trained to the end. Run in this process with baton's loop (a trial's bits
  do not depend on where it trains), so the grid's best is the best any of the 27 reaches.
- **Optuna direct**: what a user would write with Optuna: a study over the same grid (GridSampler,
  seeded) with its SuccessiveHalvingPruner (min_resource 2, reduction factor 3); each trial trains
  rung by rung with baton's loop in this process (paused at each rung, reported, pruned or continued),
  trials one after another as a single process runs them.

*best*: the best trial's best validation loss (its best checkpoint's), lower is better.

    python bench/search.py [--workers 2] [--quick] [--out bench/results/search.json]
    python bench/search.py --shaken [--quick]     # reproducibility through kills: bench/search_shaken.py

``--quick``: 9 points (learning rate x width), 9 epochs, rungs at 1 and 3 (tests/bench: minutes).
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from baton.jobs.client import JobClient  # noqa: E402
from baton.jobs.services import RedisServer, S3Server, WorkerProcess, stop_workers  # noqa: E402
from baton.schemas.overrides import apply_overrides  # noqa: E402
from baton.schemas.spec import JobSpec  # noqa: E402
from baton.storage.layout import JobPaths  # noqa: E402
from baton.storage.manifest_store import ManifestStore  # noqa: E402
from baton.storage.stores.file_store import FileStore  # noqa: E402
from baton.workers.attempt.local import register_spec  # noqa: E402
from baton.workers.attempt.session import Attempt, AttemptOptions, run_attempt  # noqa: E402
from baton.workers.training.control import LoopControl  # noqa: E402
from bench.loop_overhead import write_result  # noqa: E402

SPEC: dict[str, Any] = {
    "name": "spiral-search", "seed": 7,
    "model": {"target": "builtin:mlp", "kwargs": {"in_features": 2, "hidden": 32, "out_features": 3, "dropout": 0.0}},
    "data": {"target": "builtin:spiral", "kwargs": {"n_per_class": 200}, "batch_size": 32, "val_fraction": 0.2},
    "optimizer": {"name": "adamw", "lr": 3e-3, "weight_decay": 0.01},
    "scheduler": {"name": "onecycle", "warmup_fraction": 0.1},
    "loop": {"epochs": 18, "deterministic": True}, "checkpoint": {"every_steps": 1000, "keep_last": 2},
    "resources": {"device": "cpu", "cpu_threads": 1},
}
SPACE = {"optimizer.lr": [1e-3, 3e-3, 1e-2], "model.kwargs.hidden": [8, 32, 128], "model.kwargs.dropout": [0.0, 0.1, 0.3]}
QUICK_SPACE = {"optimizer.lr": [1e-3, 3e-3, 1e-2], "model.kwargs.hidden": [8, 32, 128]}


class Quiet(LoopControl):
    def log(self, message: str) -> None:
        pass


def case(quick: bool) -> tuple[dict, dict, int, int]:
    """(spec, grid axes, epochs, first rung)."""
    spec = copy.deepcopy(SPEC)
    if quick:
        spec["loop"]["epochs"] = 9
        return spec, QUICK_SPACE, 9, 1
    return spec, SPACE, 18, 2


# --- in this process: one trial's attempts, rung by rung -----------------------------------------
class Trial:
    def __init__(self, root: Path, spec: dict, job_id: str):
        self.store, self.job_id, self.attempts = FileStore(root), job_id, 0
        self.spec = JobSpec.parse(spec)
        register_spec(self.store, JobPaths(job_id), self.spec)

    def train_to(self, pause_at: Optional[int]) -> None:
        self.attempts += 1
        attempt = Attempt(self.spec, self.job_id, self.attempts, self.store, (), pause_at=pause_at)
        run_attempt(attempt, AttemptOptions(Quiet()))

    def manifest(self):
        return ManifestStore(self.store, JobPaths(self.job_id)).read()

    def steps(self) -> int:
        latest = self.manifest().latest
        return latest.step if latest is not None else 0

    def best(self) -> float:
        best = self.manifest().best
        assert best is not None and best.value is not None
        return best.value

    def value_at(self, epoch: int) -> float:
        from baton.searches.driver import rung_row
        from baton.storage.artifacts import read_metrics

        row = rung_row(read_metrics(self.store, self.manifest()), "epochs", epoch)
        assert row is not None
        return row["val_loss"]


def points(axes: dict) -> list[dict]:
    from baton.schemas.overrides import grid_points

    return grid_points(axes)


def full_grid(root: Path, spec: dict, axes: dict) -> dict:
    started, bests, steps = time.monotonic(), {}, 0
    for n, point in enumerate(points(axes), start=1):
        trial = Trial(root / f"grid-{n}", apply_overrides(spec, point), f"grid-{n}")
        trial.train_to(None)
        bests[repr(sorted(point.items()))] = trial.best()
        steps += trial.steps()
    return {"steps": steps, "best": min(bests.values()), "trials": len(bests), "wall_s": time.monotonic() - started,
            "bests": bests}


def optuna_direct(root: Path, spec: dict, axes: dict, epochs: int, first: int) -> dict:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rungs = [first * 3 ** k for k in range(10) if first * 3 ** k < epochs] + [epochs]
    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.GridSampler(axes, seed=0),
                                pruner=optuna.pruners.SuccessiveHalvingPruner(min_resource=first, reduction_factor=3))
    trained = []

    def objective(optuna_trial) -> float:
        point = {path: optuna_trial.suggest_categorical(path, values) for path, values in axes.items()}
        trial = Trial(root / f"optuna-{optuna_trial.number}", apply_overrides(spec, point), f"optuna-{optuna_trial.number}")
        trained.append(trial)
        for at in rungs[:-1]:
            trial.train_to(at)
            optuna_trial.report(trial.value_at(at), at)
            if optuna_trial.should_prune():
                raise optuna.TrialPruned()
        trial.train_to(None)
        return trial.best()

    started = time.monotonic()
    study.optimize(objective, n_trials=len(points(axes)))
    pruned = sum(t.state == optuna.trial.TrialState.PRUNED for t in study.trials)
    return {"steps": sum(t.steps() for t in trained), "best": study.best_value, "trials": len(study.trials),
            "pruned": pruned, "wall_s": time.monotonic() - started}


# --- on workers: baton's search -------------------------------------------------------------------
class Cluster:
    """redis-server, moto's S3 and ``baton worker`` processes, for as long as the ``with`` lasts."""

    def __init__(self, root: Path, n_workers: int):
        self.root, self.n_workers, self.workers = root, n_workers, {}

    def __enter__(self) -> "Cluster":
        self.redis, self.s3 = RedisServer().start(), S3Server().start()
        self.s3.create_bucket("search")
        self.env = {**os.environ, **self.s3.env(), "BATON_REDIS_URL": self.redis.url,
                    "BATON_STORAGE_URL": "s3://search/bench", "BATON_ALLOWED_MODULES": "tests",
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        os.environ.update(self.env)
        for _ in range(self.n_workers):
            self.add_worker()
        return self

    def add_worker(self, wait: bool = True) -> None:
        name = f"search-{len(self.workers)}@local"
        self.workers[name] = WorkerProcess(name, self.env, str(self.root / f"w{len(self.workers)}.log")).start()
        if wait:
            self.workers[name].wait_ready()

    def __exit__(self, *exc) -> None:
        stop_workers(list(self.workers.values()))
        self.redis.stop()
        self.s3.stop()


def baton_search(client: JobClient, spec: dict, axes: dict, first: int, search_id: str = "bench",
                 concurrency: Optional[int] = None) -> tuple[dict, Any]:
    """The search on the workers; ``concurrency``: asynchronous halving (ASHA) with that many trials at once."""
    halving: dict[str, Any] = {"min_resource": first, "factor": 3}
    search: dict[str, Any] = {"space": {path: {"choice": values} for path, values in axes.items()}, "sampler": "grid",
                              "halving": halving}
    if concurrency is not None:
        halving["asynchronous"] = True
        search["concurrency"] = concurrency
    started = time.monotonic()
    found = client.search(spec, search, search_id=search_id)
    while (results := client.search_results(found.id)).state == "running":
        if time.monotonic() - started > 3600:
            raise TimeoutError("the search did not finish in an hour")
        time.sleep(1.0)
    wall = time.monotonic() - started
    assert results.state == "finished", f"search {search_id} {results.state}: {results.error}"
    best = next(t for t in results.trials if t.status.id == results.best)
    stopped: dict[str, int] = {}
    for t in results.trials:
        stopped[t.standing] = stopped.get(t.standing, 0) + 1
    return {"steps": results.search_steps, "best": best.status.best_value, "trials": len(results.trials),
            "standings": stopped, "best_trial": best.params, "wall_s": wall,
            "attempts": sum(t.status.attempt for t in results.trials)}, results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--shaken", action="store_true", help="the search twice, once with workers killed "
                        "(bench/search_shaken.py): the same trials, stops and best, bit for bit")
    parser.add_argument("--seed", type=int, default=0, help="--shaken: the faults' order and moments")
    parser.add_argument("--out", default=None, help="default bench/results/search.json (--shaken: search_shaken.json)")
    args = parser.parse_args()
    spec, axes, epochs, first = case(args.quick)
    root = Path(tempfile.mkdtemp(prefix="baton-search-"))
    if args.shaken:
        from bench.search_shaken import shaken

        return shaken(spec, axes, first, Cluster(root, args.workers), args.out or "bench/results/search_shaken.json",
                      args.seed)
    with Cluster(root, args.workers):
        search, _ = baton_search(JobClient(), spec, axes, first)
        print(f"baton search: {search['steps']} steps, best {search['best']:.4f} ({search['wall_s']:.0f} s)", flush=True)
        asha, _ = baton_search(JobClient(), spec, axes, first, "bench-async", concurrency=args.workers)
        print(f"baton asynchronous search: {asha['steps']} steps, best {asha['best']:.4f} ({asha['wall_s']:.0f} s)",
              flush=True)
    grid = full_grid(root / "grid", spec, axes)
    print(f"full grid: {grid['steps']} steps, best {grid['best']:.4f} ({grid['wall_s']:.0f} s)", flush=True)
    direct = optuna_direct(root / "optuna", spec, axes, epochs, first)
    print(f"optuna direct: {direct['steps']} steps, best {direct['best']:.4f} ({direct['wall_s']:.0f} s)", flush=True)

    same = grid["bests"][repr(sorted(search["best_trial"].items()))] == search["best"]
    print(f"the search's best trial, trained on workers and paused at each rung, equals the grid's run of its "
          f"point bit for bit in its best value: {same}")
    rows = [("baton search (sync halving, 3)", search), (f"baton ASHA ({args.workers} at once)", asha),
            ("full grid", grid), ("Optuna SuccessiveHalvingPruner", direct)]
    print(f"\n{len(points(axes))} trials, {epochs} epochs, rungs from epoch {first}, factor 3 "
          f"({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f})")
    print(f"{'way':<32} {'steps':>7} {'of grid':>8} {'best val_loss':>14} {'vs grid best':>13}")
    for name, row in rows:
        print(f"{name:<32} {row['steps']:>7} {row['steps'] / grid['steps']:>8.1%} {row['best']:>14.4f} "
              f"{(row['best'] - grid['best']) / abs(grid['best']):>+13.2%}")
    write_result({"mode": "min", "monitor": "val_loss", "quick": args.quick, "trials": len(points(axes)),
                  "epochs": epochs, "first_rung": first, "factor": 3, "workers": args.workers,
                  "search_steps": search["steps"], "grid_steps": grid["steps"], "search_best": search["best"],
                  "grid_best": grid["best"], "optuna_steps": direct["steps"], "optuna_best": direct["best"],
                  "best_equals_grid_run": same, "asha_steps": asha["steps"], "asha_best": asha["best"],
                  "search": search, "asha": asha, "grid": grid, "optuna": direct}, args.out or "bench/results/search.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
