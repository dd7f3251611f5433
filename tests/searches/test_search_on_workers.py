"""A search on real workers: 9 trials sampled by TPE in rounds, successive halving by 3 at epochs 1 and 3
of 9. Its decisions are made on complete rungs (the promoted are exactly the best third of each rung's
values, read back from the trials' committed metrics); a trial stopped at two rungs and promoted ends
bit-equal to the same trial trained straight through; and the same search run again, its workers
SIGKILLed and SIGTERMed on the way, gives the same trials, stops, promotions and best trial, bit for bit."""
from __future__ import annotations

import signal
import time

import pytest

from baton.searches.driver import rung_row

from tests.helpers import assert_same_training, make_spec, metrics_rows, run_reference, wait_for

SPEC = make_spec(data={"target": "tests.probes:slow_spiral", "kwargs": {"n_per_class": 100, "delay_s": 0.004},
                       "batch_size": 32,
                       "num_workers": 0, "val_fraction": 0.2},
                 loop={"epochs": 9}, checkpoint={"every_steps": 4})
SEARCH = {"space": {"optimizer.lr": {"loguniform": [1.0e-3, 1.0e-1]}, "model.kwargs.hidden": {"choice": [8, 16, 32]}},
          "sampler": "tpe", "seed": 3, "trials": 9, "concurrency": 5, "halving": {"min_resource": 1, "factor": 3}}
STEPS_PER_EPOCH = 8  # 240 training samples in batches of 32, about a second an epoch (slow data)


def run_search(cluster, search_id: str, disturb=None):
    search = cluster.client.search(SPEC, SEARCH, search_id=search_id)
    assert [job.id for job in search.jobs] == [f"{search_id}-{n}" for n in range(1, 6)]  # the first round
    if disturb is not None:
        assert disturb(cluster, search_id)[:2] == [signal.SIGKILL, signal.SIGTERM]
    return wait_for(lambda: (r := cluster.client.search_results(search_id)).state == "finished" and r,
                    timeout=600, what=f"search {search_id} to finish", every=1.0)


def standings(results) -> list[tuple]:
    return [(t.number, t.params, t.standing, t.rung_values) for t in results.trials]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_search_halves_on_complete_rungs_and_gives_the_same_answer_through_kills(cluster, tmp_path):
    cluster.start_workers(2)
    started = time.monotonic()
    first = run_search(cluster, "calm")
    print(f"calm search: {time.monotonic() - started:.1f} s")
    assert [t.standing for t in first.trials].count("stopped at epoch 1") == 6
    assert [t.standing for t in first.trials].count("stopped at epoch 3") == 2
    finished = [t for t in first.trials if t.standing == "finished"]
    assert len(finished) == 1 and first.best == finished[0].status.id
    stopped = [t.status.last_event for t in first.trials if t.standing == "stopped at epoch 1"]
    assert all(e.startswith("stopped by search calm at epoch 1 (val_loss ") and e.endswith(" of 9)") for e in stopped)
    store = cluster.store()
    for rung, survivors in ((1, 3), (3, 1)):  # the promoted are the best of each rung, read from the metrics
        ranked = sorted((rung_row(metrics_rows(store, t.status.id), "epochs", rung)["val_loss"], t.number)
                        for t in first.trials if rung in t.rung_values)
        promoted = {n for _, n in ranked[:survivors]}
        assert promoted == {t.number for t in first.trials if any(at > rung for at in t.rung_values)
                            or t.standing == "finished"}, (rung, ranked)
    steps = sum(t.status.step for t in first.trials)
    assert steps == STEPS_PER_EPOCH * (9 * 1 + 3 * 2 + 1 * 6) + 9 * 0  # 9 to epoch 1, 3 on to 3, 1 on to 9
    assert steps == first.search_steps

    best = finished[0]
    straight = run_reference(tmp_path / "straight", {**SPEC, **_applied(best.params)})
    assert_same_training(straight, "reference", store, best.status.id)  # paused twice, promoted twice

    started = time.monotonic()
    second = run_search(cluster, "shaken", disturb=kill_workers)
    print(f"shaken search: {time.monotonic() - started:.1f} s")
    assert standings(second) == standings(first)
    assert second.best.rsplit("-", 1)[1] == first.best.rsplit("-", 1)[1]
    assert_same_training(store, first.best, store, second.best)


def _applied(params: dict) -> dict:
    from baton.schemas.overrides import apply_overrides

    return apply_overrides(SPEC, params)


def kill_workers(cluster, search_id: str) -> list[int]:
    """SIGKILL a worker holding a trial mid-epoch, SIGTERM another, SIGKILL a third, while the search runs;
    each time a new worker joins (the pool stays two strong). The signals sent."""
    killed: set[str] = set()
    sent = []
    for signum in (signal.SIGKILL, signal.SIGTERM, signal.SIGKILL):
        holder = wait_for(lambda: _finished(cluster, search_id) or _running_trial(cluster, search_id, killed),
                          timeout=300, what="a running trial")
        if holder is True:
            break
        cluster.worker(holder).signal(signum)
        killed.add(holder)
        sent.append(signum)
        cluster.start_workers(1)
    return sent


def _finished(cluster, search_id: str) -> bool:
    from baton.storage.records import searches

    return searches.meta(cluster.client.records.redis, search_id).get("state") == "finished"


def _running_trial(cluster, search_id: str, killed: set[str]):
    for job_id in cluster.client.records.sweep_ids(search_id):
        status = cluster.client.job(job_id).status()
        if (status.state.value == "running" and status.worker not in killed
                and (status.step or 0) % STEPS_PER_EPOCH not in (0, 1)):
            return status.worker
    return None
