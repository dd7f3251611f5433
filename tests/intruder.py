"""A process posing as a rank of a data-parallel attempt, as another user of the node could.

Its payload is a pickle whose loading creates a marker file: if the file appears, the receiver ran
code of the sender's choosing. Run as ``python -m tests.intruder MODE ...``:

- ``ports MARKER PORT...`` (rank 1's arguments as JSON on stdin): with only what another user sees
  (the TCP ports rank 0 listens on: /proc/net/tcp is world-readable; the spec, from shared
  storage), connect to each as a torch.distributed store client, say it is rank 1, join the process
  group and run rank 1's loop, handing rank 0 the payload at the first checkpoint. Prints one JSON
  line: what happened on each port.
- ``send-pickle RANK DIRECTORY MARKER``: a group of two through a file store in DIRECTORY, neither
  proving anything; rank 0 gathers the ranks' states as baton's rank 0 does, rank 1 sends the
  payload with torch's ``gather_object``. Prints what rank 0 received, or its error.
- ``join RANK DIRECTORY SECRET [PROOF]``: join a group of two as baton's ranks do, with SECRET
  (proving PROOF instead, where given: a process that got through the store but holds no secret).
  Prints ``joined`` or the error.
- ``tcp-rank RANK DIRECTORY SECRET``: one of two baton ranks of a sharded (fsdp) group meeting at a
  multi-node attempt's TCP store: rank 0 serves it and writes its endpoint to DIRECTORY/endpoint.
  Rank 1 is slow to reach the checkpoint group (it waits for DIRECTORY/stranger-is-in, or 5 s).
  Then rank 0 gathers an object from every rank over the checkpoint group with torch's
  ``gather_object``, as DCP's load planning does. Prints what rank 0 gathered, or the error.
- ``steal-slot DIRECTORY MARKER SECONDS``: a stranger who knows only the store's address (in
  DIRECTORY/endpoint) writes its own gloo address into rank 1's slot of the checkpoint group before
  the real rank 1 comes, keeps writing it for SECONDS, and sends the payload to whoever forms a group
  with it. Prints what happened.
- ``ring-rank RANK DIRECTORY`` (3 of them) and ``hijack DIRECTORY``: three baton ranks meeting at a
  TCP store, rank 1 a slow node; the stranger finds ranks 0 and 2's gloo listening ports (as any
  user sees them in /proc/net/tcp) and connects first to each as its pair with its ring successor,
  announcing the predictable pair number, then speaks just enough of gloo's pair protocol to take
  what is sent to it. Prints, as JSON, [victim, pair, bytes received] for each: a pair that got
  bytes was taken. A ring all-gather of proofs would pass: the honest ranks relay each other's.
- ``slow-rank RANK DIRECTORY`` (2 of them) and ``delete-slot DIRECTORY``: the stranger deletes rank
  1's address from the store over and over; rank 0 must give up within the rendezvous timeout (3 s),
  not gloo's own (the collective timeout, 20 s here).
"""
from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path


class MarkerBomb:
    """Unpickling this opens (creates) ``path``."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _send_payload_at_checkpoints(marker: str) -> None:
    """In this process only: what rank 1 hands rank 0 at a checkpoint becomes the payload."""
    import torch.distributed as dist

    from baton.workers.parallel.distributed import RankGroup

    def poisoned(self, state):
        dist.gather_object(MarkerBomb(marker), None, dst=0, group=self.control_group)

    RankGroup.gather_to_first = poisoned


def pose_on_port(port: int, args: dict, marker: str) -> str:
    import torch
    import torch.distributed as dist

    from baton.schemas.spec import JobSpec
    from baton.storage.checkpointing.contract import CheckpointTarget
    from baton.storage.layout import JobPaths
    from baton.workers.parallel.distributed import RankGroup
    from baton.workers.parallel.launcher import ready_key
    from baton.workers.parallel.layouts import DataParallel
    from baton.workers.training import rng
    from baton.workers.training.components import build_components
    from baton.workers.training.control import LoopControl
    from baton.workers.training.loop import TrainingLoop

    try:
        store = dist.TCPStore("127.0.0.1", port, 2, is_master=False, timeout=timedelta(seconds=5))
    except Exception as exc:  # not a store, or it would not take us
        return f"no store: {type(exc).__name__}"
    try:
        store.set(ready_key(1), "1")
        dist.init_process_group("gloo", store=store, rank=1, world_size=2, timeout=timedelta(seconds=60))
        spec = JobSpec.parse(args["spec"])
        group = RankGroup(1, 2, torch.device("cpu"), spec.seed, dist.group.WORLD)  # proving nothing
        _send_payload_at_checkpoints(marker)
        rng.seed_all(spec.seed)  # then rank 1's loop, as rank_main runs it, to keep step with rank 0
        layout = DataParallel(group)
        parts = layout.adopt(build_components(spec, group.device, ("tests",), 1, 2))
        target = CheckpointTarget(None, JobPaths(args["job_id"]), 1, 1)  # rank 1 writes nothing: no store
        checkpointer = layout.checkpointer(parts, target, lambda: loop.progress)
        loop = TrainingLoop(parts, checkpointer, layout.control(LoopControl()), 1, layout=layout)
        loop.run()
    except Exception as exc:
        return f"joined, then {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return "joined and trained as rank 1"


def send_pickle(rank: int, directory: Path, marker: str) -> str:
    import torch
    import torch.distributed as dist

    from baton.workers.parallel.distributed import RankGroup

    dist.init_process_group("gloo", store=dist.FileStore(str(directory / "store"), 2), rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    try:
        if rank == 1:
            dist.gather_object(MarkerBomb(marker), None, dst=0)
            return "sent"
        group = RankGroup(0, 2, torch.device("cpu"), 0, dist.group.WORLD)
        try:
            return f"received {group.gather_to_first({'rank': 0})!r}"
        except Exception as exc:
            return f"refused: {type(exc).__name__}"
    finally:
        dist.destroy_process_group()


def join(rank: int, directory: Path, secret: str, proof: str) -> str:
    from baton.workers.parallel.distributed import RankGroup, RankSeat
    from baton.workers.parallel.rendezvous import open_store

    try:
        group = RankGroup.join(open_store(directory, 2, 10, secret), RankSeat(rank, 2, "cpu"), proof, seed=0, timeout_s=60)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    group.close()
    return "joined"


CHECKPOINT_GROUP_PREFIX = "0//1//"
"""Where a two-rank fsdp group's second group (``new_group`` after the default one) keeps its gloo
addresses in the store, as torch 2.x lays them out: the default group's are under ``0//cpu//0/``."""


def tcp_rank(rank: int, directory: Path, secret: str) -> str:
    import time

    import torch.distributed as dist

    from baton.workers.parallel import rendezvous
    from baton.workers.parallel.distributed import RankGroup, RankSeat

    if rank == 0:
        store, endpoint = rendezvous.serve_tcp("127.0.0.1", 20, secret)
        (directory / "endpoint.tmp").write_text(endpoint)
        (directory / "endpoint.tmp").rename(directory / "endpoint")
    else:
        while not (directory / "endpoint").exists():
            time.sleep(0.01)
        store = rendezvous.connect_tcp((directory / "endpoint").read_text(), 20, secret)
        new_group = dist.new_group

        def slow_new_group(*args, **kwargs):  # the real rank 1 reaches the checkpoint group late
            deadline = time.monotonic() + 5
            while not (directory / "stranger-is-in").exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.5)
            return new_group(*args, **kwargs)

        dist.new_group = slow_new_group
    try:
        group = RankGroup.join(store, RankSeat(rank, 2, "cpu"), secret, seed=0, sharded=True, timeout_s=20)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    gathered = [None, None] if rank == 0 else None
    try:
        dist.gather_object(f"rank {rank}", gathered, dst=0, group=group.checkpoint_group)
    except Exception as exc:
        return f"gather failed: {type(exc).__name__}: {str(exc).splitlines()[0]}"
    return f"gathered {gathered!r}" if rank == 0 else "sent"


def steal_slot(directory: Path, marker: str, seconds: float) -> str:
    import threading
    import time

    import torch.distributed as dist

    while not (directory / "endpoint").exists():
        time.sleep(0.01)
    host, port = (directory / "endpoint").read_text().rsplit(":", 1)
    store = dist.TCPStore(host, int(port), None, False, timedelta(seconds=20))
    written: dict = {}

    class Remapped(dist.Store):
        """The stranger's own default group, laid over the checkpoint group's keys."""

        def __init__(self):
            super().__init__()

        def _key(self, key: str) -> str:
            return key.replace("0//", CHECKPOINT_GROUP_PREFIX, 1) if key.startswith("0//cpu") else key

        def set(self, key, value):
            written[self._key(key)] = value
            store.set(self._key(key), value)
            (directory / "stranger-is-in").touch()

        def get(self, key):
            return store.get(self._key(key))

        def wait(self, keys, timeout=None):
            store.wait([self._key(k) for k in keys])

        def add(self, key, value):
            return store.add(self._key(key), value)

        def check(self, keys):
            return store.check([self._key(k) for k in keys])

    stop = time.monotonic() + seconds

    def keep_writing():
        while time.monotonic() < stop:
            for key, value in list(written.items()):
                store.set(key, value)
            time.sleep(0.005)

    writer = threading.Thread(target=keep_writing, daemon=True)
    writer.start()
    try:
        dist.init_process_group("gloo", store=Remapped(), rank=1, world_size=2, timeout=timedelta(seconds=20))
    except Exception as exc:
        outcome = f"could not join: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    else:
        try:
            dist.gather_object(MarkerBomb(marker), None, dst=0)
            outcome = "joined and sent the payload"
        except Exception as exc:
            outcome = f"joined, then {type(exc).__name__}"
    writer.join()  # it goes on writing its address over the real rank's all the same
    return outcome


SECRET = "c" * 64


def listening_ports(pid: int) -> list[int]:
    """The TCP ports process ``pid`` listens on (what any user of the node sees in /proc/net/tcp)."""
    sockets = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            sockets.add(target[len("socket:["):-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as fh:
            for line in fh.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in sockets:  # LISTEN, and this process's socket
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


def _meet(rank: int, directory: Path, rendezvous_s: float):
    """A baton rank's end of a TCP store (rank 0 serves it), sealed with SECRET."""
    import time

    from baton.workers.parallel import rendezvous

    (directory / f"pid{rank}.tmp").write_text(str(os.getpid()))  # whole or not at all: a reader polls for it
    (directory / f"pid{rank}.tmp").rename(directory / f"pid{rank}")
    if rank == 0:
        store, endpoint = rendezvous.serve_tcp("127.0.0.1", rendezvous_s, SECRET)
        (directory / "endpoint.tmp").write_text(endpoint)
        (directory / "endpoint.tmp").rename(directory / "endpoint")
        return store
    while not (directory / "endpoint").exists():
        time.sleep(0.01)
    return rendezvous.connect_tcp((directory / "endpoint").read_text(), rendezvous_s, SECRET)


def ring_rank(rank: int, directory: Path) -> str:
    import time

    from baton.workers.parallel.distributed import RankGroup, RankSeat

    store = _meet(rank, directory, 20)
    if rank == 1:
        time.sleep(6)  # a slow node
    try:
        RankGroup.join(store, RankSeat(rank, 3, "cpu"), SECRET, seed=0, timeout_s=15)
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return "joined"


def hijack(directory: Path) -> str:
    import socket
    import struct
    import threading
    import time

    for rank in (0, 2):
        while not (directory / f"pid{rank}").exists():
            time.sleep(0.01)
    pids = {rank: int((directory / f"pid{rank}").read_text()) for rank in (0, 2)}
    while not (directory / "endpoint").exists():
        time.sleep(0.01)
    store_port = int((directory / "endpoint").read_text().rsplit(":", 1)[1])
    ports: dict[int, int] = {}
    while len(ports) < 2:
        for rank in (0, 2):
            found = set(listening_ports(pids[rank])) - {store_port}
            if found:
                ports[rank] = found.pop()
        time.sleep(0.005)
    # the ring 0 -> 1 -> 2 -> 0: a rank that listens for its successor's pair can be taken (which side of a
    # pair listens depends on the addresses: both are tried)
    received = {(0, 1): 0, (2, 0): 0}

    def take(victim: int, pair: int) -> None:
        sock = socket.create_connection(("127.0.0.1", ports[victim]))
        sock.sendall(struct.pack("<q", pair))
        sock.settimeout(25)

        def read(n: int) -> bytes:
            got = b""
            while len(got) < n:
                chunk = sock.recv(n - len(got))
                if not chunk:
                    raise EOFError
                got += chunk
            return got

        try:
            while True:
                _, op, slot, _, length, _ = struct.unpack("<6Q", read(48))
                if op == 2:  # the peer would send: say we are ready for it
                    sock.sendall(struct.pack("<6Q", 48, 3, slot, 0, length, 0))
                elif op == 1:
                    received[(victim, pair)] += len(read(length))
        except (EOFError, OSError):
            pass

    takers = [threading.Thread(target=take, args=key) for key in received]
    for taker in takers:
        taker.start()
    for taker in takers:
        taker.join()
    return json.dumps([[victim, pair, count] for (victim, pair), count in received.items()])


def slow_rank(rank: int, directory: Path) -> str:
    import time

    from baton.workers.parallel.distributed import RankGroup, RankSeat

    store = _meet(rank, directory, 3)
    if rank == 0:
        time.sleep(2)  # it joins once the others said they are ready
    started = time.monotonic()
    try:
        RankGroup.join(store, RankSeat(rank, 2, "cpu"), SECRET, seed=0, timeout_s=20)
    except Exception as exc:
        return f"{type(exc).__name__} after {time.monotonic() - started:.0f}s"
    return "joined"


def delete_slot(directory: Path) -> str:
    import time

    import torch.distributed as dist

    while not (directory / "endpoint").exists():
        time.sleep(0.01)
    store = dist.TCPStore("127.0.0.1", int((directory / "endpoint").read_text().rsplit(":", 1)[1]), None, False,
                          timedelta(seconds=5))
    deleted, end = 0, time.monotonic() + 30
    while time.monotonic() < end:
        try:
            deleted += bool(store.delete_key("0//cpu//0/1"))
        except Exception:  # the store is gone: its attempt ended
            break
        time.sleep(0.001)
    return f"deleted rank 1's address {deleted} time(s)"


def main() -> int:
    mode, rest = sys.argv[1], sys.argv[2:]
    if mode == "ports":
        args = json.loads(sys.stdin.read())
        print(json.dumps({port: pose_on_port(int(port), args, rest[0]) for port in rest[1:]}), flush=True)
    elif mode == "send-pickle":
        print(send_pickle(int(rest[0]), Path(rest[1]), rest[2]), flush=True)
    elif mode == "join":
        print(join(int(rest[0]), Path(rest[1]), rest[2], rest[3] if len(rest) > 3 else rest[2]), flush=True)
    elif mode == "tcp-rank":
        print(tcp_rank(int(rest[0]), Path(rest[1]), rest[2]), flush=True)
    elif mode == "steal-slot":
        print(steal_slot(Path(rest[0]), rest[1], float(rest[2])), flush=True)
    elif mode == "ring-rank":
        print(ring_rank(int(rest[0]), Path(rest[1])), flush=True)
    elif mode == "hijack":
        print(hijack(Path(rest[0])), flush=True)
    elif mode == "slow-rank":
        print(slow_rank(int(rest[0]), Path(rest[1])), flush=True)
    elif mode == "delete-slot":
        print(delete_slot(Path(rest[0])), flush=True)
    else:
        raise SystemExit(f"unknown mode {mode!r}: ports, send-pickle or join")
    return 0


if __name__ == "__main__":
    sys.exit(main())
