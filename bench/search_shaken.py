"""A search's answer through kills: bench/search.py's search (27 grid points halved by 3 at epochs 2 and 6
of 18; ``--quick``: 9 points, rungs 1 and 3 of 9) run twice on the same workers, once undisturbed and
once while 4 workers are SIGKILLed and 2 SIGTERMed, in a seeded random order, at seeded random moments
spread over the first 70 % of the undisturbed run's time (from the first round to the last rungs), each
on a worker training a trial mid-epoch (the first after that moment); a new worker is started after
each, so the pool keeps its size. Both runs must end with the same trials stopped at the same rungs with the same metric
at each, and the same best trial with its final state bit-equal (torch.equal on every tensor, equal
losses, identical exported weights).

The trials' data loads each sample in 3 ms (``tests.probes:slow_spiral``, the same samples) so that a
trial is mid-epoch long enough to be hit, and ``retry.max_attempts`` is 10 (four kills may land on one
trial); both runs use that spec.

    python bench/search.py --shaken [--quick] [--workers 2] [--seed 0]

Writes bench/results/search_shaken.json; exits 1 unless everything above held.
"""
from __future__ import annotations

import copy
import random
import signal
import threading
import time
from typing import Any, Optional

from baton.jobs.client import JobClient
from baton.storage.stores.open import open_client_store

from bench.loop_overhead import write_result
from tests.helpers import assert_same_training

FAULTS = [signal.SIGKILL] * 4 + [signal.SIGTERM] * 2
STEPS_PER_EPOCH = 15  # 480 training samples (3 classes of 200, 80 %) in batches of 32


def slowed(spec: dict) -> dict:
    """The search's spec, its data paced, and room for its faults: 4 SIGKILLs may hit one trial (a worker
    killed mid-step loses the attempt), which the default ``retry.max_attempts`` of 3 would fail, as it should;
    a team on preemptible workers raises it the same way."""
    spec = copy.deepcopy(spec)
    spec["data"] = {**spec["data"], "target": "tests.probes:slow_spiral",
                    "kwargs": {**spec["data"]["kwargs"], "delay_s": 0.003}}
    spec["retry"] = {**spec.get("retry", {}), "max_attempts": 10}
    return spec


def standings(results) -> list[tuple]:
    return [(t.number, t.params, t.standing, t.rung_values) for t in results.trials]


class Shaker(threading.Thread):
    """Signals the workers while a search runs: each fault at a random moment, on a worker training a
    trial of ``search_id`` mid-epoch (one it has not signalled before), then starts a new worker."""

    def __init__(self, cluster, search_id: str, seed: int, span_s: float):
        super().__init__(daemon=True)
        self.cluster, self.search_id, self.rng = cluster, search_id, random.Random(seed)
        self.faults = FAULTS[:]
        self.rng.shuffle(self.faults)
        self.moments = sorted(self.rng.uniform(0.0, span_s) for _ in self.faults)  # s after the search starts
        self.sent: list[dict[str, Any]] = []
        self.done = threading.Event()

    def run(self) -> None:
        client, hit, started = JobClient(), set(), time.monotonic()
        for signum, moment in zip(self.faults, self.moments):
            self.done.wait(max(0.0, started + moment - time.monotonic()))
            target = None
            while target is None and not self.done.is_set():
                target = self._holder(client, hit)
                time.sleep(0.05)
            if target is None:
                return
            worker, job_id, step = target
            self.cluster.workers[worker].signal(signum)
            hit.add(worker)
            at = time.monotonic() - started
            self.sent.append({"signal": signum.name, "worker": worker, "trial": job_id, "step": step, "at_s": round(at, 1)})
            print(f"  {at:5.1f} s: {signum.name} {worker} while it trained {job_id} at step {step}", flush=True)
            self.cluster.add_worker(wait=False)  # (it joins when it is ready; the next fault need not wait)
        self.done.wait()  # (a worker started here dies with this thread: die_with_parent)

    def _holder(self, client: JobClient, hit: set) -> Optional[tuple[str, str, int]]:
        for job_id in client.records.sweep_ids(self.search_id):
            status = client.job(job_id).status()
            if (status.state.value == "running" and status.worker in self.cluster.workers and status.worker not in hit
                    and (status.step or 0) % STEPS_PER_EPOCH not in (0, 1)):
                return status.worker, job_id, status.step or 0
        return None


def shaken(spec: dict, axes: dict, first: int, cluster, out: str, seed: int = 0) -> int:
    from bench.search import baton_search

    spec = slowed(spec)
    with cluster:
        client = JobClient()
        calm, calm_results = baton_search(client, spec, axes, first, "calm")
        print(f"calm search: {calm['steps']} steps, best {calm['best']:.4f} ({calm['wall_s']:.0f} s)", flush=True)
        shaker = Shaker(cluster, "shaken", seed, span_s=0.7 * calm["wall_s"])  # spread over the rounds and rungs
        shaker.start()
        try:
            shook, shook_results = baton_search(client, spec, axes, first, "shaken")
        finally:
            shaker.done.set()
            shaker.join(timeout=120)
        print(f"shaken search: {shook['steps']} steps, best {shook['best']:.4f} ({shook['wall_s']:.0f} s)", flush=True)
        store = open_client_store(client.settings.storage_url)
        same_best = calm_results.best.rsplit("-", 1)[1] == shook_results.best.rsplit("-", 1)[1]
        bit_equal = False
        if same_best:
            try:
                assert_same_training(store, calm_results.best, store, shook_results.best)
                bit_equal = True
            except AssertionError as exc:
                print(f"the best trials differ: {exc}")
    same = standings(calm_results) == standings(shook_results)
    for a, b in zip(standings(calm_results), standings(shook_results)):
        if a != b:
            print(f"  differs: calm {a}\n          shaken {b}")
    held = same and same_best and bit_equal and len(shaker.sent) == len(FAULTS)
    print(f"\n{calm['trials']} trials, rungs from epoch {first}, factor 3, {cluster.n_workers} workers; "
          f"faults sent: {len(shaker.sent)} of {len(FAULTS)} ({', '.join(f['signal'] for f in shaker.sent)})")
    print(f"{'run':<8} {'steps':>7} {'attempts':>9} {'best trial':>16} {'best val_loss':>14} {'wall s':>7}")
    for name, row, results in (("calm", calm, calm_results), ("shaken", shook, shook_results)):
        print(f"{name:<8} {row['steps']:>7} {row['attempts']:>9} {results.best:>16} {row['best']:>14.6f} "
              f"{row['wall_s']:>7.0f}")
    print(f"same trials, stops and rung metrics: {same}; same best trial: {same_best}; its final state bit-equal: "
          f"{bit_equal}")
    write_result({"mode": calm_results.mode, "monitor": calm_results.monitor, "seed": seed, "faults": shaker.sent,
                  "same_standings": same, "same_best": same_best, "best_bit_equal": bit_equal, "held": held,
                  "calm": calm, "shaken": shook}, out)
    return 0 if held else 1
