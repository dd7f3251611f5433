"""A search's steps against a real Redis and store, without workers: a decider SIGKILLed in the middle of
creating a round (a trial's record written, not yet indexed) leaves a search that the next decider
completes with the very trials an undisturbed search has, and no more; a trial whose sampled parameters
make no valid spec is recorded failed, saying why, instead of stopping the search (which fails when no
trial succeeds); a search whose known trials would be invalid, whose id a sweep or search has, whose
trials' ids jobs have, or which searches a path its overrides set, is refused before anything is written;
a job that takes a trial's id after the submit is never adopted as that trial."""
from __future__ import annotations

import json
import signal
from pathlib import Path
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


def held_decider(client: JobClient, held, search_id: str) -> subprocess.Popen:
    """A process submitting search ``search_id``, held at each trial's creation (its record written, not yet
    indexed) while a file of it is in ``held`` (storage/failpoints.py)."""
    env = baton_env(BATON_REDIS_URL=client.settings.redis_url, BATON_STORAGE_URL=client.settings.storage_url,
                    BATON_FAILPOINT_PAUSE=str(held))
    code = ("import json, sys\nfrom baton.jobs.client import JobClient\n"
            "JobClient().search(json.loads(sys.argv[1]), json.loads(sys.argv[2]), search_id=sys.argv[3])")
    return subprocess.Popen([sys.executable, "-c", code, json.dumps(SPEC), json.dumps(SEARCH), search_id], env=env,
                            cwd=REPO)


@pytest.mark.slow
def test_a_decider_killed_mid_round_leaves_the_trials_an_undisturbed_search_has(client, tmp_path):
    client.search(SPEC, SEARCH, search_id="calm")
    held = tmp_path / "held"
    held.mkdir()
    proc = held_decider(client, held, "killed")
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
    assert (results.state, results.best) == ("failed", None)  # not "finished": nothing came of it
    assert results.error == "no trial of the last rung succeeded with a finite val_loss"


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


def written(client: JobClient, search_id: str, search: dict = SEARCH) -> None:
    """A search's record as a submit writes it, without the submit's checks (the driver's side alone)."""
    from baton.schemas.search import SearchSpec
    from baton.schemas.spec import JobSpec

    assert searches.create(client.records.redis, search_id, {
        "spec": JobSpec.parse(SPEC).model_dump_json(), "search": SearchSpec.parse(search).model_dump_json(by_alias=True),
        "monitor": "val_loss", "mode": "min", "unit": "epochs", "end": "3", "storage_url": client.settings.storage_url})


def test_an_id_a_sweep_search_or_job_holds_refuses_the_search_or_sweep_and_writes_nothing(client):
    client.sweep(SPEC, {"seed": [1, 2]}, sweep_id="grid")
    with pytest.raises(SpecError, match="invalid search") as caught:
        client.search(SPEC, SEARCH, search_id="grid")
    assert caught.value.problems == ["id: a sweep, search or job 'grid' already exists"]
    assert not client.records.redis.exists(keys.search("grid")) and client.records.sweep_ids("grid") == ["grid-1", "grid-2"]

    client.search(SPEC, SEARCH, search_id="found")
    with pytest.raises(SpecError, match="a sweep or search 'found' already exists"):
        client.sweep(SPEC, {"seed": [1, 2]}, sweep_id="found")
    assert client.records.sweep_ids("found") == ["found-1", "found-2", "found-3"]

    client.submit(SPEC, job_id="mine-5")  # a job of its own, whose id a search "mine" of 6 trials would give trial 5
    with pytest.raises(SpecError, match="invalid search") as caught:
        client.search(SPEC, SEARCH, search_id="mine")
    assert caught.value.problems == ["id: a job 'mine-5' already exists"]
    assert not client.records.redis.exists(keys.search("mine")) and client.records.sweep_ids("mine") == []


def test_a_job_that_took_a_trials_id_after_the_submit_is_not_adopted_and_the_search_fails_saying_so(client):
    client.submit(SPEC, job_id="late-2")
    written(client, "late")
    client.search_driver("late").advance()
    results = client.search_results("late")
    assert (results.state, [t.number for t in results.trials]) == ("failed", [1])
    assert results.error == "trial 2's id 'late-2' was taken by a job that is not this search's: the search cannot go on"
    mine = client.records.raw("late-2")
    assert "sweep" not in mine and "pause_at" not in mine and client.records.sweep_ids("late") == ["late-1"]


def test_a_stranger_in_the_searchs_index_is_no_trial(client):
    client.records.add_to_sweep("mixed", ["stranger", "other"])  # scores 0 and 1: neither is this search's trial
    written(client, "mixed")
    client.search_driver("mixed").advance()
    assert [t.status.id for t in client.search_results("mixed").trials] == ["mixed-1", "mixed-2", "mixed-3"]


def test_a_searched_path_that_an_override_also_sets_is_refused(client):
    with pytest.raises(SpecError, match="invalid search") as caught:
        client.search(SPEC, SEARCH, overrides={"optimizer.lr": 0.01}, search_id="twice")
    assert caught.value.problems == ["search.space.optimizer.lr: also set by --set/overrides (optimizer.lr); the "
                                     "search would overwrite it in every trial: drop one"]
    assert not client.records.redis.exists(keys.search("twice"))


def test_a_misspelled_path_is_named_once_not_once_per_bound(client):
    wrong = {**SEARCH, "space": {"optimizer.lrr": {"uniform": [0.001, 0.1]}}}
    with pytest.raises(SpecError) as caught:
        client.search(SPEC, wrong, search_id="typo")
    assert len([p for p in caught.value.problems if p.startswith("search.space.optimizer.lrr")]) == 1, caught.value.problems


def test_sweep_results_of_a_search_id_is_the_searchs_results(client):
    client.search(SPEC, SEARCH, search_id="either")
    results = client.sweep_results("either")
    assert (type(results).__name__, results.state, [t.number for t in results.trials]) == ("SearchResults", "running",
                                                                                             [1, 2, 3])


def test_a_cancelled_search_cancels_its_trials_and_takes_no_further_step(client):
    from baton.schemas.errors import JobNotFound

    client.search(SPEC, SEARCH, search_id="stopme")
    assert client.cancel_sweep("stopme") == {"stopme-1": "cancelled", "stopme-2": "cancelled", "stopme-3": "cancelled"}
    client.search_driver("stopme").advance()  # a worker's or the reaper's step after the cancel
    results = client.search_results("stopme")
    assert results.state == "cancelled" and [t.standing for t in results.trials] == ["cancelled"] * 3
    assert client.cancel_sweep("stopme") == {f"stopme-{n}": "already cancelled" for n in (1, 2, 3)}

    client.sweep(SPEC, {"seed": [1, 2]}, sweep_id="plain")
    assert client.cancel_sweep("plain") == {"plain-1": "cancelled", "plain-2": "cancelled"}
    with pytest.raises(JobNotFound, match="no sweep or search 'nothing'"):
        client.cancel_sweep("nothing")


def test_the_sweep_commands_answer_an_unknown_id_in_one_line_with_exit_1(client):
    from tests.helpers import run_baton

    env = baton_env(BATON_REDIS_URL=client.settings.redis_url, BATON_STORAGE_URL=client.settings.storage_url)
    for command in ("sweep-status", "sweep-cancel"):
        done = run_baton(command, "nothing", env=env)
        assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, (command, done.stderr)
    client.search(SPEC, SEARCH, search_id="byline")
    done = run_baton("sweep-cancel", "byline", env=env)
    assert (done.returncode, done.stdout.strip()) == (0, "byline: 3 cancelled")
    shown = run_baton("sweep-status", "byline", "--report", str(client.settings.storage_url[7:] + "-report"), env=env)
    assert shown.returncode == 0 and shown.stdout.startswith("search byline: cancelled;"), shown.stderr
    page = Path(client.settings.storage_url[7:] + "-report") / "report.md"
    assert "| 3 | byline-3 | cancelled |" in page.read_text() and page.with_name("rungs.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_a_trial_a_decider_creates_after_the_cancel_is_cancelled_and_one_it_left_unindexed_too(client, tmp_path):
    """The cancel marks the search first, then cancels every trial record of it, indexed or not: a decider held
    between a trial's record and its index (or killed there) cannot leave a trial to train."""
    held = tmp_path / "held"
    held.mkdir()
    for search_id, kill in (("late", False), ("dead", True)):
        proc = held_decider(client, held, search_id)
        try:
            for first in wait_for(lambda: list(held.glob(f"trial-created.{search_id}-1.*")), timeout=120,
                                  what="trial 1"):
                first.unlink()
            second = wait_for(lambda: list(held.glob(f"trial-created.{search_id}-2.*")), timeout=60, what="trial 2")
            if kill:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
            answers = client.cancel_sweep(search_id)  # trial 2's record exists, not indexed
            assert answers == {f"{search_id}-1": "cancelled", f"{search_id}-2": "cancelled"}, answers
            for hold in second:
                hold.unlink(missing_ok=True)  # the held decider goes on: it indexes trial 2, sees the cancel
            assert proc.wait(timeout=60) in (0, -signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait()
        assert client.records.state(f"{search_id}-2").value == "cancelled"
        assert not client.records.exists(f"{search_id}-3")  # no trial after it
        assert searches.meta(client.records.redis, search_id)["state"] == "cancelled"
    assert client.cancel_sweep("late")["late-1"] == "already cancelled"


def test_a_job_id_a_running_searchs_trial_will_have_is_refused(client):
    client.search(SPEC, SEARCH, search_id="claim")  # 6 trials: claim-1 .. claim-6; 3 queued so far
    with pytest.raises(SpecError) as caught:
        client.submit(SPEC, job_id="claim-5")
    assert caught.value.problems == ["id: 'claim-5' is a trial's of the running search 'claim'"]
    with pytest.raises(SpecError, match="'claim-1' already exists"):
        client.submit(SPEC, job_id="claim-1")
    client.submit(SPEC, job_id="claim-7")  # no trial of it: free
    client.cancel_sweep("claim")
    client.submit(SPEC, job_id="claim-5")  # a search that no longer runs claims nothing


def test_a_searched_path_holding_a_set_one_is_refused_too(client):
    whole = {**SEARCH, "space": {"optimizer": {"choice": [{"name": "adamw", "lr": 0.01}, {"name": "sgd", "lr": 0.1}]}}}
    with pytest.raises(SpecError) as caught:
        client.search(SPEC, whole, overrides={"optimizer.lr": 0.01}, search_id="holds")
    assert caught.value.problems == ["search.space.optimizer: also set by --set/overrides (optimizer.lr); the search "
                                     "would overwrite it in every trial: drop one"]


def test_a_search_of_a_trials_team_or_priority_is_refused(client):
    for path, values in (("resources.team", ["vision", "nlp"]), ("resources.priority", [1, 1_000_000_000])):
        with pytest.raises(SpecError) as caught:
            client.search(SPEC, {**SEARCH, "space": {path: {"choice": values}}}, search_id="policy")
        assert caught.value.problems == [f"search.space.{path}: a search cannot search a trial's {path.split('.')[1]} "
                                         "(every trial is the search's, under its team's limits): set it in the spec"]
    with pytest.raises(SpecError, match="cannot search a trial's code"):
        client.search(SPEC, {**SEARCH, "space": {"code.dir": {"choice": ["/etc", "/root"]}}}, search_id="policy")
    assert not client.records.sweep_taken("policy")


def test_a_halving_search_of_the_runs_length_a_bad_seed_or_a_jobs_id_is_refused_and_a_large_seed_samples(client):
    lengths = {**SEARCH, "space": {"loop.epochs": {"int": [2, 6]}}}
    with pytest.raises(SpecError) as caught:
        client.search(SPEC, lengths, search_id="lengths")
    assert [p.split(":")[0] for p in caught.value.problems] == ["search.space.loop.epochs"], caught.value.problems
    with pytest.raises(SpecError, match="search.seed"):
        client.search(SPEC, {**SEARCH, "seed": -1}, search_id="negative")
    client.search(SPEC, {**SEARCH, "seed": 50_000}, search_id="large")  # (its rounds' seeds wrap below 2**32)
    client.submit(SPEC, job_id="mine")
    with pytest.raises(SpecError, match="a sweep, search or job 'mine' already exists"):
        client.search(SPEC, SEARCH, search_id="mine")


def test_cancelling_an_ended_search_leaves_the_trials_it_stopped_paused(client):
    written(client, "over")
    client.search_driver("over").advance()
    client.records.redis.hset(keys.job("over-2"), "state", "paused")  # (as a rung would leave it: stopped there)
    searches.finish(client.records.redis, "over", "over-1")
    answers = client.cancel_sweep("over")
    assert answers["over-2"] == "already stopped by its search" and client.records.state("over-2").value == "paused"
    assert searches.meta(client.records.redis, "over")["state"] == "finished"  # (an end is never overwritten)
