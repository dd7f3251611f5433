"""An asynchronous search (ASHA) on real workers: no rung waits, so which trials go on depends on timing;
what does not is its rule, checked when it has ended: every trial among the best 1/factor of a rung went
on from it, every other one stopped there (paused, resumable, saying so), and the best trial is the best
of those that reached the end."""
from __future__ import annotations

import pytest

from baton.searches.sampling import known_trials, sample_one
from baton.schemas.search import SearchSpec

from tests.helpers import make_spec, wait_for

SPEC = make_spec(data={"target": "tests.probes:slow_spiral", "kwargs": {"n_per_class": 100, "delay_s": 0.002},
                       "batch_size": 32, "num_workers": 0, "val_fraction": 0.2},
                 loop={"epochs": 9}, checkpoint={"every_steps": 4})
SEARCH = {"space": {"optimizer.lr": {"loguniform": [1.0e-3, 1.0e-1]}}, "sampler": "random", "seed": 4, "trials": 5,
          "concurrency": 2, "halving": {"min_resource": 1, "factor": 3, "asynchronous": True}}  # rungs 1, 3, 9
STEPS_PER_EPOCH = 8


def test_an_asynchronous_searchs_trials_are_known_from_its_seed_except_what_tpe_learns():
    search = SearchSpec.parse(SEARCH)
    assert known_trials(search, "min") == known_trials(search, "min") and len(known_trials(search, "min")) == 5
    assert known_trials(search, "min")[2] == sample_one(search, 3, [], "min")
    tpe = SearchSpec.parse({**SEARCH, "sampler": "tpe"})
    assert len(known_trials(tpe, "min")) == 2  # the first places' trials: later ones learn from the rungs


@pytest.mark.slow
@pytest.mark.quick  # (the quick tier's asynchronous search)
@pytest.mark.timeout(600)
def test_an_asynchronous_search_promotes_by_its_rule_and_ends_with_the_best_that_finished(cluster, tmp_path):
    cluster.start_workers(2)
    started = cluster.client.search(SPEC, SEARCH, search_id="asha")
    assert [job.id for job in started.jobs] == ["asha-1", "asha-2"]  # two places: a trial starts as one frees
    results = wait_for(lambda: (r := cluster.client.search_results("asha")).state != "running" and r,
                       timeout=500, what="the asynchronous search to end", every=1.0)
    assert results.state == "finished" and len(results.trials) == 5, (results.state, results.error)
    reached = {"stopped at epoch 1": 1, "stopped at epoch 3": 3, "finished": 9}
    epochs = {t.number: reached[t.standing] for t in results.trials}
    for rung, keep in ((1, 5 // 3), (3, 1)):  # the best 1/3 of each rung, and at least one of the last (few arrive)
        there = sorted((t.rung_values[rung], t.number) for t in results.trials if epochs[t.number] >= rung)
        assert all(epochs[n] > rung for _, n in there[:keep]), (rung, there, epochs)
    for t in results.trials:
        if t.standing != "finished":
            assert t.status.state.value == "paused"
            assert t.status.last_event.startswith(f"stopped by search asha at epoch {epochs[t.number]} (asynchronous")
    finished = [t for t in results.trials if t.standing == "finished"]
    assert finished and results.best == min(finished, key=lambda t: (t.status.best_value, t.number)).status.id
    assert results.search_steps == STEPS_PER_EPOCH * sum(epochs.values())  # each trial's epochs, none twice

    page, plot = cluster.client.search_report("asha", tmp_path / "report")  # its report: the table and the plot
    text = page.read_text()
    assert f"**Best trial: {results.best}**" in text and all(f"| {t.number} | {t.status.id} | {t.standing} |" in text
                                                            for t in results.trials)
    assert plot.read_bytes()[:4] == b"\x89PNG"
