"""Who may join a data-parallel attempt's process group: only the ranks its rank 0 started.

- **No port.** The rendezvous is a ``FileStore`` in the attempt's private directory (mode 0700), not
  a ``TCPStore``: a TCPStore listens on every interface, whatever host it is given, without
  authentication, and lists its keys to any client, so any process that reached its port could
  register as a rank, and rank 0 would form the group with it. A file only this user can open
  needs no port.
- **Across nodes, a port.** A job on several nodes (``resources.nodes``) cannot share a file: its
  leader serves a ``TCPStore`` on a free port (``serve_tcp``), and every other rank connects to it
  (``connect_tcp``). Anyone who reaches that port can write to it, so what follows matters all the
  more: nothing a peer sends is trusted before it proved the secret.
- **A secret, proven.** Each attempt has a random secret, handed to its ranks in their environment
  (never on their command line: every user of the node can read /proc/PID/cmdline). Once the group
  is formed, every rank proves it over the group's own connections (an HMAC of its rank) before
  anything else is exchanged on them: those connections are TCP too, and a process that took a
  rank's place on one (connecting first to a port it saw listening) is found there.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from .errors import RankLost

SECRET_ENV = "BATON_RANK_SECRET"
"""The environment variable that hands a rank its attempt's secret (a name the log redaction hides)."""


def new_secret() -> str:
    return secrets.token_hex(32)


def open_store(directory: Path, world_size: int, timeout_s: float) -> "dist.FileStore":
    """The attempt's rendezvous, in its private ``directory`` (rank 0 creates it first)."""
    store = dist.FileStore(str(directory / "rendezvous"), world_size)
    store.set_timeout(timedelta(seconds=timeout_s))
    return store


def serve_tcp(address: str, timeout_s: float) -> tuple["dist.TCPStore", str]:
    """A multi-node attempt's rendezvous, served by its leader on a free port: (the store, the
    endpoint ``address:port`` the other nodes' ranks connect to)."""
    store = dist.TCPStore(address, 0, None, True, timedelta(seconds=timeout_s), wait_for_workers=False)
    return store, f"{address}:{store.port}"


def connect_tcp(endpoint: str, timeout_s: float) -> "dist.TCPStore":
    host, port = endpoint.rsplit(":", 1)
    return dist.TCPStore(host, int(port), None, False, timedelta(seconds=timeout_s))


def prove_membership(secret: str, rank: int, world_size: int, group) -> None:
    """Every rank shows the others, over ``group``'s connections, that it holds the attempt's secret;
    a group with a rank that does not is left before anything else travels on it (RankLost: a loss,
    not the job's failure, as the job is not to blame)."""
    proofs = [torch.zeros(32, dtype=torch.uint8) for _ in range(world_size)]
    dist.all_gather(proofs, _proof(secret, rank), group=group)
    strangers = [r for r, proof in enumerate(proofs)
                 if not hmac.compare_digest(bytes(proof.tolist()), _proof(secret, r).numpy().tobytes())]
    if strangers:
        raise RankLost(f"rank(s) {', '.join(map(str, strangers))} of the process group did not prove this attempt's "
                       "secret: a process that is not one of its ranks joined the group, and nothing was exchanged "
                       "with it")


def _proof(secret: str, rank: int) -> torch.Tensor:
    digest = hmac.new(secret.encode(), f"baton rank {rank}".encode(), hashlib.sha256).digest()
    return torch.frombuffer(bytearray(digest), dtype=torch.uint8)
