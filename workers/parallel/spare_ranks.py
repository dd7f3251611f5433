"""Ranks 1..N-1 forked ahead of their attempt, as its checkpoint writer is (``baton.storage.forked``).

A rank started as a new interpreter (``python -m baton.workers.parallel.rank_main``) spends seconds of a
core importing torch and baton's training code before it reaches the group (about 2 s on a quiet 2-core
machine, several times that on a loaded one), and a data-parallel job pays that at every start and every
resume. A process that has those imported and no thread yet (a worker's training process as it starts,
``baton run`` once its imports are done) forks the ranks its attempt will need instead (``fork``): each
waits, idle, on a pipe of its own for its place and the attempt's secret, which ``launcher.Ranks`` sends
it (``start``) once rank 0 knows them. A spare never has the secret in its environment.

A spare is rank 0's child, as a started rank is: it asks the kernel for SIGKILL when rank 0 dies
(``PR_SET_PDEATHSIG``), and one no attempt takes exits when its pipe closes (rank 0 exited; a worker's
training process also kills what it leaves as it ends). Where no spare is left (a process that ran a
thread already, a fork the kernel refused), ``launcher`` starts a new interpreter as before. (A
multi-node follower's ranks, started by its worker's multi-threaded main process, are forked from its
worker's forkserver instead: ``forked_ranks``.)
"""
from __future__ import annotations

import functools
import json
import os
import signal
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Optional

from baton.storage import forked

RANK_NAME = "baton-rank"
"""The name a spare rank goes by (``/proc/PID/comm``): its command line is its parent's."""


@dataclass
class Spare:
    proc: forked.ForkedChild
    orders: Connection  # its pipe's sending end


_spares: list[Spare] = []


def fork(count: int) -> None:
    """Fork ``count`` spare ranks, where this process may fork (``forked.may_fork``); else, or where the
    kernel refuses a fork, fewer (the others start as new interpreters)."""
    if count <= 0 or _spares or not forked.may_fork():
        return
    parent = os.getpid()
    # a Ctrl-C or a SIGTERM to the process group is rank 0's to act on: a spare ignores both from its first
    # instruction (blocked across the fork) until its rank's own handlers take them (``rank_main``)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        for _ in range(count):
            orders_r, orders_w = os.pipe()
            try:
                proc = forked.fork(RANK_NAME, {orders_r}, functools.partial(_wait_and_serve, orders_r, parent, mask))
            except OSError:
                os.close(orders_w)
                return
            finally:
                os.close(orders_r)
            _spares.append(Spare(proc, Connection(orders_w, readable=False)))
    except OSError:  # (no descriptor for a pipe)
        return
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _wait_and_serve(orders: int, parent: int, mask: set) -> int:
    """A spare's life: its place and secret from its pipe, then the rank's (``rank_main.serve``)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    _spares.clear()  # (its siblings, whose pipes it does not hold)
    from baton.workers.parallel import rank_main
    from baton.workers.parallel.launcher import die_with_parent

    die_with_parent(parent)
    try:
        message = Connection(orders, writable=False).recv_bytes()
    except EOFError:  # no attempt took it
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
                spare.orders.send_bytes(message)  # (its length first: the spare reads exactly that)
                return spare.proc
        except OSError:  # it died meanwhile (a broken pipe)
            spare.proc.kill()
        finally:
            spare.orders.close()
        spare.proc.wait()
    return None
