"""A job's code that writes into the channel between its training process and the worker (tests.rogue) is
heard as data, not run as code: a pickle is refused unread, a message of the wrong shape too; the attempt
ends as the job's failure, saying why, and the worker goes on to run the next job."""
from __future__ import annotations

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
