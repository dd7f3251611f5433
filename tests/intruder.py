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
- ``join RANK DIRECTORY SECRET``: join a group of two as baton's ranks do, with SECRET. Prints
  ``joined`` or the error.
"""
from __future__ import annotations

import json
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
    from baton.storage.layout import JobPaths
    from baton.workers.parallel.distributed import RankGroup
    from baton.workers.parallel.launcher import ready_key
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
        parts = group.adopt(build_components(spec, group.device, ("tests",), 1, 2))
        loop = TrainingLoop(parts, None, group.control(LoopControl()), 1, group=group)
        loop.checkpointer = group.checkpointer(None, parts, JobPaths(args["job_id"]).for_attempt(1), lambda: loop.progress)
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


def join(rank: int, directory: Path, secret: str) -> str:
    from baton.workers.parallel.distributed import RankGroup
    from baton.workers.parallel.rendezvous import open_store

    try:
        group = RankGroup.join(open_store(directory, 2, 60), rank, 2, "cpu", 0, secret, timeout_s=60)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    group.close()
    return "joined"


def main() -> int:
    mode, rest = sys.argv[1], sys.argv[2:]
    if mode == "ports":
        args = json.loads(sys.stdin.read())
        print(json.dumps({port: pose_on_port(int(port), args, rest[0]) for port in rest[1:]}), flush=True)
    elif mode == "send-pickle":
        print(send_pickle(int(rest[0]), Path(rest[1]), rest[2]), flush=True)
    elif mode == "join":
        print(join(int(rest[0]), Path(rest[1]), rest[2]), flush=True)
    else:
        raise SystemExit(f"unknown mode {mode!r}: ports, send-pickle or join")
    return 0


if __name__ == "__main__":
    sys.exit(main())
