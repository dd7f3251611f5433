"""Two clients submitting one job id at the same moment: one is accepted, the other refused as "id
taken", and the stored spec.json is the accepted one's (``baton recover`` rebuilds jobs from it)."""
from __future__ import annotations

import json
import threading

from baton.jobs.client import JobClient
from baton.schemas.errors import SpecError
from baton.storage.layout import JobPaths
from tests.helpers import make_spec


def test_of_two_clients_racing_on_one_id_one_wins_and_spec_json_is_the_winners(cluster):
    clients = [JobClient(redis_url=cluster.redis_url, storage_url=cluster.storage_url) for _ in range(2)]
    store = cluster.store()
    for race in range(10):
        job_id = f"race-{race}"
        specs = [make_spec(seed=100 + i) for i in range(2)]
        barrier, outcomes = threading.Barrier(2), [None, None]

        def submit(i: int) -> None:
            barrier.wait()
            try:
                clients[i].submit(specs[i], job_id)
                outcomes[i] = "accepted"
            except SpecError as exc:
                outcomes[i] = str(exc)

        threads = [threading.Thread(target=submit, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(outcomes, key=str)[0] == "accepted" and outcomes.count("accepted") == 1, outcomes
        refused = next(o for o in outcomes if o != "accepted")
        assert f"id: a job {job_id!r} already exists" in refused
        winner = outcomes.index("accepted")
        stored = json.loads(store.get_bytes(JobPaths(job_id).spec))
        recorded = json.loads(cluster.client.records.raw(job_id)["spec"])
        assert stored["seed"] == recorded["seed"] == specs[winner]["seed"], (race, stored["seed"], recorded["seed"])
