"""A job's code that turns on its worker (tests.rogue). What it writes into the channel between its training
process and the worker is heard as data, not run as code: a pickle is refused unread, a message of the
wrong shape too; the attempt ends as the job's failure, saying why, and the worker goes on to run the next
job. The store its training process holds reaches that job's objects alone, and its environment holds
none of the pool's credentials."""
from __future__ import annotations

import json

import pytest

from tests.helpers import make_spec


def rogue(marker, what: str) -> dict:
    return make_spec(model={"target": "tests.rogue:channel_writer",
                            "kwargs": {"marker": str(marker), "at_forward": 3, "what": what}},
                     loop={"epochs": 2}, scheduler={"name": "none"})


@pytest.mark.slow
@pytest.mark.quick
def test_a_pickle_or_a_forged_message_from_the_jobs_code_is_refused_and_the_worker_goes_on(cluster, tmp_path):
    worker, = cluster.start_workers(1)
    marker = tmp_path / "the-worker-ran-the-jobs-code"
    pickled = cluster.client.submit(rogue(marker, "pickle"), "pickled")
    forged = cluster.client.submit(rogue(tmp_path / "unused", "forged"), "forged")
    honest = cluster.client.submit(make_spec(loop={"epochs": 1}), "honest")

    for job, why in ((pickled, "not a message of the channel's"), (forged, "tell on_step: ")):
        final = job.wait(timeout=120, progress=False)
        assert final.state.value == "failed" and final.attempt == 1, final
        assert final.error.startswith("ChannelRefused: the training process sent its worker a message it may not "
                                      f"send ({why}"), final.error
        assert "the job's code wrote into baton's channel" in final.error
    assert not marker.exists()  # the pickle was never loaded

    final = honest.wait(timeout=120, progress=False)
    assert final.state.value == "succeeded", final.error
    assert final.worker == worker.name and worker.proc.poll() is None  # the same worker process, unharmed
    assert worker.log().count("a message it may not send: ") == 2  # its own line for each, then it went on


@pytest.mark.slow
def test_the_store_a_jobs_code_finds_in_its_process_reaches_no_other_jobs_objects(cluster, tmp_path):
    cluster.start_workers(1)
    victim = cluster.client.submit(make_spec(loop={"epochs": 1}), "victim")
    assert victim.wait(timeout=120, progress=False).state.value == "succeeded"
    store = cluster.store()
    before = {key: store.get_bytes(key) for key in store.list("jobs/victim/")}
    report = tmp_path / "report.json"
    spec = make_spec(model={"target": "tests.rogue:store_prober", "kwargs": {"report": str(report), "victim": "victim"}},
                     loop={"epochs": 1})
    final = cluster.client.submit(spec, "prober").wait(timeout=120, progress=False)
    assert final.state.value == "succeeded", final.error  # it trained, checkpointed and finished through its gate

    found = json.loads(report.read_text())
    assert found.pop("stores") == ["GatedStore"]  # the only store in its process: its worker's gate
    assert len(found) == 8 and set(found.values()) == {"OutsideJob"}, found
    assert {key: store.get_bytes(key) for key in store.list("jobs/victim/")} == before
    assert not store.list("jobs/victim-stolen/")


@pytest.mark.slow
def test_a_jobs_code_finds_none_of_the_pools_credentials_in_its_environment(cluster, tmp_path):
    key_id, secret = f"pool-key-{tmp_path.name}", f"pool-secret-{tmp_path.name}-0123456789"
    cluster.start_workers(1, AWS_ACCESS_KEY_ID=key_id, AWS_SECRET_ACCESS_KEY=secret, BATON_JOB_ENV_DROP="TEAM_TOKEN_*",
                          TEAM_TOKEN_A="team-token-abcdefgh")
    report = tmp_path / "report.json"
    looked_for = [key_id, secret, cluster.redis_url, cluster.storage_url, "team-token-abcdefgh"]
    spec = make_spec(model={"target": "tests.rogue:environment_reader",
                            "kwargs": {"report": str(report), "secrets": looked_for}}, loop={"epochs": 1})
    final = cluster.client.submit(spec, "reader").wait(timeout=120, progress=False)
    assert final.state.value == "succeeded", final.error  # it trained and checkpointed without any of them

    assert json.loads(report.read_text()) == {"names": [], "os.environ": [], "own /proc environ": [],
                                              "parent's /proc environ": [], "a process it started": []}
