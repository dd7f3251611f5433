"""What a worker does with a message: the job it starts (``run_job``: the first waiting job it can host,
of every queue it serves) or the gang it joins (``join_gang``); the delivery of that job is
``delivery.Delivery``, led from here when it runs on several nodes (``gang_leader``)."""
from __future__ import annotations

from typing import Optional

from baton.workers.queue import gang_follower, gang_leader, reception
from baton.workers.queue.delivery import Delivery
from baton.workers.queue.reception import pass_on, read_job
from baton.workers.queue.worker_control import WorkerContext


def run_job(ctx: WorkerContext, job_id: str, attempt: int, queue: Optional[str] = None) -> str:
    """Take a message of ``job_id``'s attempt: start the first waiting job that this worker can host, of the
    start order of every queue it serves (``reception.choices``: by priority across them), or pass the
    message on if it can host none and not the message's own job. A job of another queue than the
    message's leaves the message on its own queue for the jobs waiting there. Returns a word saying how it
    ended (for logs and tests). A job on several nodes is led from here: its gang forms first, then the
    attempt is claimed (``gang_leader``)."""
    queue = queue or _queue_of(ctx, job_id)
    if reception.drained(ctx):
        return reception.hold_drained(ctx, job_id, attempt)
    handed_back = False
    for _ in range(CHOICE_ROUNDS):  # workers that took messages together race for the same first jobs
        raced = False
        for choice in reception.choices(ctx, queue, job_id, attempt):
            if isinstance(choice, reception.Passed):
                return pass_on(ctx, choice.job_id, choice.attempt, choice.why, choice.event)
            if choice.view.queue != queue and not handed_back:  # a job of another queue this worker serves:
                handed_back = True  # the message goes back to its own queue, for a job waiting there
                reception.hand_back(ctx, job_id, attempt, queue)
            delivery = Delivery(ctx, choice.job_id, choice.attempt, choice.view)
            word = gang_leader.lead(ctx, delivery) if choice.view.nodes > 1 else delivery.run()
            if word != "dropped":  # (dropped: another worker claimed it first, or it no longer waits)
                return word
            raced = True
        if not raced:
            break
    if read_job(ctx, job_id) is None:
        return pass_on(ctx, job_id, attempt, "its record could not be read")
    return "dropped"


CHOICE_ROUNDS = 3
"""How many times a worker reads its queue's first waiting jobs again when other workers claimed every
one it tried first (many workers freed at once): each round, others have started jobs."""


def _queue_of(ctx: WorkerContext, job_id: str) -> str:
    """The queue of a message sent without one (before messages named it)."""
    view = read_job(ctx, job_id)
    return view.queue if view is not None else "default"


def join_gang(ctx: WorkerContext, job_id: str, attempt: int, nodes: int) -> str:
    """A join message of a multi-node job: this worker becomes one of its nodes, if it can host one."""
    view = read_job(ctx, job_id)
    cannot = reception.refusal(ctx, job_id, view) if view is not None else None
    if cannot is None and reception.drained(ctx):
        cannot = f"{ctx.worker} is drained"
    queue = view.queue if view is not None else "default"
    return gang_follower.follow(ctx, job_id, attempt, nodes, queue, cannot, reception.PASS_ON_WAIT_S)
