"""The ranks' order a multi-node leader's training process asks its worker to publish comes from where the
job's code runs: the worker publishes it for the other nodes only if it is the attempt's own
(gang_leader.matching_order), so a leader's code cannot point the followers at another job or store."""
from __future__ import annotations

import pytest

from baton.schemas.messages import AttemptOrder, GroupOrder
from baton.schemas.spec import JobSpec
from baton.workers.queue.gang_leader import OrderRefused, matching_order
from tests.helpers import make_spec

ATTEMPT = AttemptOrder(spec=JobSpec.model_validate(make_spec()), job_id="ours", attempt=3, storage_url="s3://pool/runs",
                       claim="c", allowed_prefixes=("tests",), worker="w@h")
OURS = GroupOrder(spec=ATTEMPT.spec, job_id="ours", attempt=3, storage_url="s3://pool/runs", world_size=2, cpu_threads=1,
                  device_type="cpu", allowed_prefixes=("tests",), resume_key="jobs/ours/attempt-2/step-5.pt")


def test_the_attempts_own_order_passes():
    assert matching_order(OURS.model_dump_json(), ATTEMPT) == OURS


@pytest.mark.parametrize("change, named", [
    ({"job_id": "theirs"}, "job_id"),
    ({"attempt": 4}, "attempt"),
    ({"storage_url": "s3://elsewhere/runs"}, "storage_url"),
    ({"allowed_prefixes": ("tests", "os")}, "allowed_prefixes"),
    ({"spec": ATTEMPT.spec.model_copy(update={"seed": 99})}, "spec"),
    ({"resume_key": "jobs/theirs/attempt-1/step-5.pt"}, "resume_key"),
])
def test_an_order_of_another_job_store_or_spec_is_not_published(change, named):
    with pytest.raises(OrderRefused, match=rf"\({named} differ\)"):
        matching_order(OURS.model_copy(update=change).model_dump_json(), ATTEMPT)


def test_an_order_that_is_not_one_is_refused():
    with pytest.raises(OrderRefused, match="the ranks' order is not one"):
        matching_order('{"job_id": "ours"}', ATTEMPT)
