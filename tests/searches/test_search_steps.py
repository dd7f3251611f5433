"""A search's steps against a real Redis and store, without workers: a decider SIGKILLed in the middle of
creating a round (a trial's record written, not yet indexed) leaves a search that the next decider
completes with the very trials an undisturbed search has, and no more; a trial whose sampled parameters
make no valid spec is recorded failed, saying why, instead of stopping the search; a search whose known
trials would be invalid is refused before anything is written."""
from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
import redis

from baton.jobs.client import JobClient
from baton.schemas.errors import SpecError
from baton.storage.records import keys, searches

from tests.helpers import REPO, baton_env, make_spec, wait_for

SPEC = make_spec(loop={"epochs": 3})
SEARCH = {"space": {"optimizer.lr": {"loguniform": [1.0e-3, 1.0e-1]}, "model.kwargs.hidden": {"choice": [8, 16]}},
          "sampler": "random", "seed": 2, "trials": 6, "concurrency": 3, "halving": {"min_resource": 1}}


@pytest.fixture
def client(redis_server, tmp_path, monkeypatch):
    redis.Redis.from_url(redis_server.url).flushdb()
    monkeypatch.setenv("BATON_REDIS_URL", redis_server.url)
    monkeypatch.setenv("BATON_STORAGE_URL", f"file://{tmp_path / 'store'}")
    return JobClient()


def params(client: JobClient, search_id: str) -> dict[int, dict]:
    return {t.number: t.params for t in client.search_results(search_id).trials}


def test_a_decider_killed_mid_round_leaves_the_trials_an_undisturbed_search_has(client, tmp_path):
    client.search(SPEC, SEARCH, search_id="calm")
    held = tmp_path / "held"
    held.mkdir()
    env = baton_env(BATON_REDIS_URL=client.settings.redis_url, BATON_STORAGE_URL=client.settings.storage_url,
                    BATON_FAILPOINT_PAUSE=str(held))
    code = ("import json, sys\nfrom baton.jobs.client import JobClient\n"
            "JobClient().search(json.loads(sys.argv[1]), json.loads(sys.argv[2]), search_id='killed')")
    proc = subprocess.Popen([sys.executable, "-c", code, json.dumps(SPEC), json.dumps(SEARCH)], env=env, cwd=REPO)
    try:
        for first in wait_for(lambda: list(held.glob("trial-created.killed-1.*")), timeout=120, what="trial 1"):
            first.unlink()  # trial 1 goes on to its index
        wait_for(lambda: list(held.glob("trial-created.killed-2.*")), timeout=60, what="trial 2's creation")
        proc.send_signal(signal.SIGKILL)  # trial 2's record is written, not indexed; trial 3 not created
    finally:
        proc.kill()
        proc.wait()
    assert client.records.exists("killed-2") and not client.records.exists("killed-3")
    assert client.records.sweep_ids("killed") == ["killed-1"]

    lock = keys.search_part("killed", "lock")
    wait_for(lambda: not client.records.redis.exists(lock), timeout=30, what="the dead decider's lock to lapse")
    client.search_driver("killed").advance()  # as the reaper's pass, or the next trial to change, would
    assert params(client, "killed") == params(client, "calm")
    assert len(params(client, "calm")) == 3  # the first round only: the next waits for its first rung
    assert searches.meta(client.records.redis, "killed")["state"] == "running"


STEPPED = make_spec(loop={"max_steps": 30, "eval_every_steps": 5}, scheduler={"name": "onecycle", "warmup_fraction": 0.2})
STEPPED["loop"].pop("epochs")
TOO_SHORT = {"space": {"scheduler.warmup_fraction": {"uniform": [0.0001, 0.001]}}, "sampler": "random", "seed": 0,
             "trials": 2, "halving": {"min_resource": 10}}  # onecycle needs 2 steps of warmup: 30 x 0.001 has none


def test_a_bound_that_makes_no_valid_spec_refuses_the_search_at_submit(client):
    with pytest.raises(SpecError, match="invalid search") as caught:
        client.search(STEPPED, TOO_SHORT, search_id="bounds")
    assert any("search.space.scheduler.warmup_fraction (0.0001)" in p for p in caught.value.problems)
    assert not client.records.redis.exists(keys.search("bounds"))


def test_a_sampled_trial_that_makes_no_valid_spec_is_recorded_failed_and_the_search_ends(client):
    """The driver's side, for a search its submit did not check (written as a submit writes it)."""
    from baton.schemas.search import SearchSpec
    from baton.schemas.spec import JobSpec

    parsed = JobSpec.parse(STEPPED)
    assert searches.create(client.records.redis, "unchecked", {
        "spec": parsed.model_dump_json(), "search": SearchSpec.parse(TOO_SHORT).model_dump_json(by_alias=True),
        "monitor": "val_loss", "mode": "min", "unit": "steps", "end": "30", "storage_url": client.settings.storage_url})
    client.search_driver("unchecked").advance()
    results = client.search_results("unchecked")
    assert [t.status.state.value for t in results.trials] == ["failed", "failed"]
    assert all("warmup" in (t.status.error or "") for t in results.trials), [t.status.error for t in results.trials]
    assert (results.state, results.best) == ("finished", None)


def test_a_combination_no_single_value_shows_is_refused_before_anything_is_written(client):
    spec = make_spec(loop={"max_steps": 30, "eval_every_steps": 5}, scheduler={"name": "none"})
    spec["loop"].pop("epochs", None)
    search = {"space": {"scheduler.name": {"choice": ["none", "onecycle"]},
                        "scheduler.warmup_fraction": {"choice": [0.2, 0.01]}}, "sampler": "grid",
              "halving": {"min_resource": 10}}
    with pytest.raises(SpecError, match="invalid search") as caught:
        client.search(spec, search, search_id="combo")
    assert any(p.startswith("search trial 4 ") and "warmup_fraction" in p for p in caught.value.problems), \
        caught.value.problems
    assert not client.records.redis.exists(keys.search("combo")) and client.records.sweep_ids("combo") == []
