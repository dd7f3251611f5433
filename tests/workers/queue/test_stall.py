"""A job that hangs (user code or a data loader stuck) while its heartbeat keeps the lease alive:
the stall watchdog releases it as a worker loss with every thread's stack in its status, and the
worker process exits (a hung thread cannot be interrupted) for its supervisor to restart."""
from __future__ import annotations

from baton.workers.queue.stall import EXIT_STALLED

from tests.helpers import make_spec

HANGING = make_spec(model={"target": "tests.probes:hanging_mlp", "kwargs": {"hang_after": 6}},
                    retry={"max_attempts": 2})


def test_a_hung_job_is_released_with_its_stacks_and_the_worker_exits(cluster):
    hung, = cluster.start_workers(1, BATON_STALL_TIMEOUT_S="3")
    job = cluster.client.submit(HANGING, "hung")
    assert hung.proc.wait(timeout=90) == EXIT_STALLED
    status = job.status()
    assert (status.state.value, status.attempt, status.lost) == ("retrying", 1, 1)  # a worker loss: counted
    assert "no optimizer step for" in status.last_event
    assert "_hang_forever" in status.stall_stacks and "baton-heartbeat" in status.stall_stacks  # every thread

    # retried on a fresh worker, where it hangs again: a hang that repeats ends at retry.max_attempts
    again, = cluster.start_workers(1, BATON_STALL_TIMEOUT_S="3")
    assert again.proc.wait(timeout=90) == EXIT_STALLED
    final = job.wait(timeout=30, progress=False)
    assert (final.state.value, final.attempt, final.lost) == ("failed", 2, 2)
    assert "retry.max_attempts" in final.error and "_hang_forever" in final.traceback
