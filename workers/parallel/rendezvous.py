"""Who may join a data-parallel attempt's process group: only the ranks its rank 0 started.

- **No port.** The rendezvous is a ``FileStore`` in the attempt's private directory (mode 0700), not
  a ``TCPStore``: a TCPStore listens on every interface, whatever host it is given, without
  authentication, and lists its keys to any client, so any process that reached its port could
  register as a rank, and rank 0 would form the group with it. A file only this user can open
  needs no port.
- **Across nodes, a port.** A job on several nodes (``resources.nodes``) cannot share a file: its
  leader serves a ``TCPStore`` on a free port (``serve_tcp``), and every other rank connects to it
  (``connect_tcp``). Anyone who reaches that port can read and write its keys.
- **A secret.** Each attempt has a random secret, handed to its ranks in their environment (never
  on their command line: every user of the node can read /proc/PID/cmdline).
- **Sealed values.** The ranks see the store only through ``SealedStore``: every value a rank
  writes (gloo's listening addresses, NCCL's unique id, the ranks' ready marks) is encrypted and
  authenticated with a key derived from the secret (AES-GCM, the key's name bound in), and a value
  that does not open is not used. A stranger at the port can neither read where the ranks listen
  nor put its own address in a rank's place: a group forms only with addresses the ranks wrote.
  A rank that meets a value it cannot open waits for the real one (the real rank writes over it);
  if none comes within the rendezvous timeout, the attempt ends as a loss (``RankLost``).
- **Every group, proven, connection by connection.** Once a group is formed, and before anything
  else travels on it, every rank sends every other rank, over the connection between the two, an
  HMAC of the group's name, its own rank and the receiver's (an all-to-all: each pair's bytes travel
  on that pair alone, never relayed by a third rank, as a ring all-gather's would be). Those
  connections are TCP too, and a process that took a rank's place on one (connecting first to a
  port it found listening) cannot send what the rank at the other end checks. The default group, the control group and a
  sharded job's checkpoint group are each proven (``distributed.RankGroup.join``); DCP's planning
  unpickles what the checkpoint group's peers send, so that group is used only after its proof.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from baton.workers.parallel.errors import RankLost

SECRET_ENV = "BATON_RANK_SECRET"
"""The environment variable that hands a rank its attempt's secret (a name the log redaction hides)."""


def new_secret() -> str:
    return secrets.token_hex(32)


class SealedStore(dist.Store):
    """A torch.distributed store whose values are sealed with the attempt's secret (module doc).

    Only what process groups, NCCL and the launcher use is offered: ``set``/``get``/``wait``/
    ``check``, and ``add`` for counters (a number cannot be sealed; a stranger can only bump it, and
    no membership rests on one). The rest refuses rather than pass an unsealed value."""

    _NONCE = 12

    def __init__(self, inner: "dist.Store", secret: str, timeout_s: float):
        super().__init__()
        self.inner, self.timeout_s = inner, timeout_s
        self._aead = AESGCM(hmac.new(secret.encode(), b"baton rendezvous seal", hashlib.sha256).digest())

    def set(self, key: str, value) -> None:
        nonce = os.urandom(self._NONCE)
        self.inner.set(key, nonce + self._aead.encrypt(nonce, _as_bytes(value), key.encode()))

    def get(self, key: str) -> bytes:
        """The value a rank wrote under ``key``. One that does not open (a stranger's) is passed over:
        the real rank writes over it, so this waits for that; all within the rendezvous timeout."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            self._wait_until([key], deadline)  # (a key a stranger deleted waits no longer than that either)
            opened = self._open(key, self.inner.get(key))
            if opened is not None:
                return opened
            if time.monotonic() >= deadline:
                raise RankLost(f"the rendezvous value {key!r} was not sealed with this attempt's secret: a process "
                               f"that is not one of its ranks wrote it, and no rank's value came in "
                               f"{self.timeout_s:.0f}s")
            time.sleep(0.02)

    def wait(self, keys, timeout=None) -> None:
        """As the store's, but never past the rendezvous timeout (gloo asks with the collective one)."""
        limit = self.timeout_s if timeout is None else min(self.timeout_s, timeout.total_seconds())
        self._wait_until(keys, time.monotonic() + limit)

    def _wait_until(self, keys, deadline: float) -> None:
        self.inner.wait(keys, timedelta(seconds=max(0.001, deadline - time.monotonic())))

    def check(self, keys) -> bool:
        """Whether every key holds a value a rank wrote (one a stranger wrote does not count)."""
        return self.inner.check(keys) and all(self._open(key, self.inner.get(key)) is not None for key in keys)

    def _open(self, key: str, sealed: bytes):
        try:
            return self._aead.decrypt(sealed[:self._NONCE], sealed[self._NONCE:], key.encode())
        except (InvalidTag, ValueError):
            return None

    def add(self, key: str, amount: int) -> int:
        return self.inner.add(key, amount)

    def set_timeout(self, timeout) -> None:
        self.inner.set_timeout(timeout)

    def delete_key(self, key: str) -> bool:
        return self.inner.delete_key(key)

    def num_keys(self) -> int:
        return self.inner.num_keys()

    def compare_set(self, key, expected, desired):
        raise NotImplementedError("the rendezvous store seals every value: compare_set is not offered")

    def append(self, key, value):
        raise NotImplementedError("the rendezvous store seals every value: append is not offered")


def _as_bytes(value) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def open_store(directory: Path, world_size: int, timeout_s: float, secret: str) -> SealedStore:
    """The attempt's rendezvous, in its private ``directory`` (rank 0 creates it first)."""
    store = dist.FileStore(str(directory / "rendezvous"), world_size)
    store.set_timeout(timedelta(seconds=timeout_s))
    return SealedStore(store, secret, timeout_s)


def serve_tcp(address: str, timeout_s: float, secret: str) -> tuple[SealedStore, str]:
    """A multi-node attempt's rendezvous, served by its leader on a free port: (the store, the
    endpoint ``address:port`` the other nodes' ranks connect to)."""
    store = dist.TCPStore(address, 0, None, True, timedelta(seconds=timeout_s), wait_for_workers=False)
    return SealedStore(store, secret, timeout_s), f"{address}:{store.port}"


def connect_tcp(endpoint: str, timeout_s: float, secret: str) -> SealedStore:
    host, port = endpoint.rsplit(":", 1)
    return SealedStore(dist.TCPStore(host, int(port), None, False, timedelta(seconds=timeout_s)), secret, timeout_s)


def prove_membership(secret: str, rank: int, world_size: int, group, name: str = "default",
                     device: torch.device = torch.device("cpu")) -> None:
    """Every rank shows every other, over the connection between the two, that it holds the
    attempt's secret (a proof bound to the group's ``name``, the sender and the receiver: an
    all-to-all, so that no rank's proof is relayed by another, as a ring's would be); a group with a
    connection that does not prove it is left before anything else travels on it (RankLost: a loss,
    not the job's failure, as the job is not to blame). ``device``: where the group's tensors live
    (a CUDA device for an NCCL group)."""
    sent = torch.cat([_proof(secret, rank, peer, name) for peer in range(world_size)]).to(device)
    received = torch.zeros(32 * world_size, dtype=torch.uint8, device=device)
    dist.all_to_all_single(received, sent, group=group)
    got = received.cpu().numpy().tobytes()
    strangers = [peer for peer in range(world_size)
                 if not hmac.compare_digest(got[32 * peer:32 * (peer + 1)],
                                            _proof(secret, peer, rank, name).numpy().tobytes())]
    if strangers:
        raise RankLost(f"rank(s) {', '.join(map(str, strangers))} of the {name} process group did not prove this "
                       "attempt's secret: a process that is not one of its ranks holds the connection, and nothing "
                       "was exchanged with it")


def _proof(secret: str, sender: int, receiver: int, name: str) -> torch.Tensor:
    message = f"baton: rank {sender} to rank {receiver} in the {name} group".encode()
    return torch.frombuffer(bytearray(hmac.new(secret.encode(), message, hashlib.sha256).digest()), dtype=torch.uint8)
