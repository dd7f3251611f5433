"""Ranks 1..N-1 forked ahead of their attempt, as its checkpoint writer is (``baton.storage.forked``).

A rank started as a new interpreter (``python -m baton.workers.parallel.rank_main``) spends about 10 s
of a core importing torch and baton's training code before it reaches the group, and a data-parallel
job pays that at every start and every resume. A process that has those imported and no thread yet (a
worker's training process as it starts, ``baton run`` once its imports are done) forks the ranks its
attempt will need instead (``fork``): each waits, idle, on a pipe of its own for its place and the
attempt's secret, which ``launcher.Ranks`` sends it (``start``) once rank 0 knows them. The secret never
appears in a rank's environment.

A spare is rank 0's child, as a started rank is: it asks the kernel for SIGKILL when rank 0 dies
(``PR_SET_PDEATHSIG``), and one no attempt takes exits when its pipe closes (rank 0 exited) or is
killed (``discard``). Where no spare is left (a process that had a thread already, a multi-node follower's worker,
whose ranks start from its multi-threaded main process), ``launcher`` starts a new interpreter as before.
"""
from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from typing import Optional

from baton.storage import forked

RANK_NAME = "baton-rank"
"""The name a spare rank goes by (``/proc/PID/comm``): its command line is its parent's."""


@dataclass
class Spare:
    proc: forked.ForkedChild
    orders: int  # the write end of its pipe


_spares: list[Spare] = []


def fork(count: int) -> None:
    """Fork ``count`` spare ranks, where this process may fork (``forked.may_fork``); else none."""
    if count <= 0 or _spares or not forked.may_fork():
        return
    parent = os.getpid()
    for _ in range(count):
        orders_r, orders_w = os.pipe()
        proc = forked.fork(RANK_NAME, {orders_r}, functools.partial(_wait_and_serve, orders_r, parent))
        os.close(orders_r)
        _spares.append(Spare(proc, orders_w))


def _wait_and_serve(orders: int, parent: int) -> int:
    """A spare's life: its place and secret from the pipe, then the rank's (``rank_main.serve``)."""
    from baton.workers.parallel import rank_main
    from baton.workers.parallel.launcher import die_with_parent

    die_with_parent(parent)
    with os.fdopen(orders, "rb") as pipe:
        message = pipe.read()
    if not message:  # no attempt took it
        return 0
    given = json.loads(message)
    return rank_main.serve(given["place"], given["secret"])


def start(place: dict, secret: str) -> Optional[forked.ForkedChild]:
    """A spare, given its place (``RankOrder``'s fields) and the attempt's secret: the rank's process; None
    when no live spare is left."""
    message = json.dumps({"place": place, "secret": secret}).encode()
    while _spares:
        spare = _spares.pop(0)
        try:
            if spare.proc.poll() is None:
                with os.fdopen(spare.orders, "wb") as pipe:  # (closed on the way out: its end of the message)
                    pipe.write(message)
                return spare.proc
            os.close(spare.orders)
        except OSError:  # it died meanwhile (a broken pipe)
            spare.proc.kill()
        spare.proc.wait()
    return None


def discard() -> None:
    """End the spares no attempt took."""
    while _spares:
        spare = _spares.pop()
        os.close(spare.orders)
        spare.proc.kill()  # (a copy of the pipe's end in a forked data loader worker would keep it waiting)
        spare.proc.wait()
