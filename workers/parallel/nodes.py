"""Starting an attempt's group: rank 0's node (``start_group``) and, for a multi-node job, every other
node (``start_node``), each starting its own ranks the one way (``launcher.Ranks``).

Rank 0 learns who else is in its group from its ``Peers``: ``ThisNode`` (the group is this node's
ranks, meeting at a file store in the attempt's private directory), or a multi-node leader's
(``LeaderPeers``: the ranks meet at a TCP store rank 0 serves on the leader's address, which the
worker publishes for the other nodes with the ranks' order, and reports what those nodes' workers
said of their ranks). The worker side of a leader answers ``LeaderPeers``' calls
(``baton.workers.queue.gang_leader``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional, Protocol

import torch.distributed as dist

from baton.schemas.errors import TransientError
from baton.schemas.manifest import CheckpointEntry
from baton.schemas.messages import GroupOrder, PeersOrder
from baton.schemas.spec import JobSpec
from baton.storage import owned_dirs
from baton.workers.parallel import forked_ranks, rendezvous
from baton.workers.parallel.distributed import RankGroup, RankSeat
from baton.workers.parallel.peer_calls import ANNOUNCE, REMOTE_FAILURE
from baton.workers.parallel.launcher import RANKS_PREFIX, RENDEZVOUS_TIMEOUT_S, Meeting, Ranks, check_devices
from baton.storage.checkpoint_io import SHARDS_KEY



class Peers(Protocol):
    """The other nodes of an attempt's group, as its rank 0 sees them."""

    loss_wait_s: float

    def meet(self, directory: Path, world_size: int, secret: str) -> tuple["dist.Store", Optional[str]]:
        """Where the ranks meet: the store rank 0 opens, and the endpoint other nodes connect to (None: none)."""

    def announce(self, endpoint: Optional[str], secret: str, order: GroupOrder) -> None:
        """Tell the other nodes to start their ranks (RankLost if they are gone)."""

    def remote_failure(self) -> Optional[BaseException]:
        """What another node reported of its ranks (RankFailed, RankLost, NodeReleased), None before."""


class ThisNode:
    """A group of this node's ranks alone."""

    loss_wait_s = 5.0

    def __init__(self, nodes: int = 1):
        if nodes > 1:
            raise TransientError(f"resources.nodes: {nodes}: this attempt has no other nodes; the job goes back to "
                                 "its queue, whose workers form a gang for it")

    def meet(self, directory: Path, world_size: int, secret: str) -> tuple["dist.Store", Optional[str]]:
        return rendezvous.open_store(directory, world_size, RENDEZVOUS_TIMEOUT_S, secret), None

    def announce(self, endpoint: Optional[str], secret: str, order: GroupOrder) -> None:
        pass

    def remote_failure(self) -> Optional[BaseException]:
        return None


class LeaderPeers:
    """A multi-node attempt's leader, in its training process: ``call`` asks the worker (its channel)."""

    def __init__(self, order: PeersOrder, call: Callable[..., Any]):
        self.nodes, self.address, self.loss_wait_s = order.nodes, order.address, order.loss_wait_s
        self._call = call

    def meet(self, directory: Path, world_size: int, secret: str) -> tuple["dist.Store", Optional[str]]:
        return rendezvous.serve_tcp(self.address, RENDEZVOUS_TIMEOUT_S, secret)

    def announce(self, endpoint: Optional[str], secret: str, order: GroupOrder) -> None:
        self._call(ANNOUNCE, endpoint, secret, order.model_dump_json())

    def remote_failure(self) -> Optional[BaseException]:
        return self._call(REMOTE_FAILURE)


def peers_for(order: Optional[PeersOrder], call: Callable[..., Any]) -> Optional[Peers]:
    """The peers an attempt's order names (None: the group is this node's)."""
    return LeaderPeers(order, call) if order is not None else None


def group_order(spec: JobSpec, job_id: str, attempt: int, storage_url: str, threads: int,
                allowed_prefixes: tuple[str, ...], resume: tuple[Optional[dict], Optional[CheckpointEntry]]) -> GroupOrder:
    """What every rank of the group starts from: ``resume`` is (the state rank 0 resumes from, its
    checkpoint). A plain checkpoint each rank reads and verifies itself; a sharded one this node's
    ranks load from the directory rank 0 downloaded, and other nodes download it themselves."""
    from baton.workers.training.determinism import resolve_device

    state, entry = resume
    shards = state.get(SHARDS_KEY) if state is not None else None
    return GroupOrder(
        spec=spec, job_id=job_id, attempt=attempt, storage_url=storage_url, world_size=spec.resources.ranks,
        cpu_threads=threads, device_type=resolve_device(spec.resources.device).type, allowed_prefixes=allowed_prefixes,
        resume_key=entry.key if entry is not None and shards is None else None,
        resume_sha256=entry.sha256 if entry is not None else None, resume_dir=shards,
        resume_entry=entry if entry is not None and shards is not None else None)


def start_group(order: GroupOrder, peers: Peers, log: Callable[[str], None],
                store_url: Optional[str] = None) -> tuple[Ranks, RankGroup]:
    """Start this node's other ranks, tell the other nodes (if any), and join the group as rank 0 once
    every rank has reached the rendezvous; ``store_url``: what the ranks open the store with (``Ranks``)."""
    spec = order.spec
    check_devices(order.device_type, spec.resources.processes)
    secret = rendezvous.new_secret()
    directory = owned_dirs.make(RANKS_PREFIX)  # 0700: this user's processes only
    store, endpoint = peers.meet(directory, order.world_size, secret)
    meeting = Meeting(secret, store, endpoint, peers.remote_failure, peers.loss_wait_s)
    ranks = Ranks(order, range(1, spec.resources.processes), meeting, log, directory, store_url=store_url)
    try:
        if endpoint is not None:
            log(f"multi-node: {spec.resources.nodes} nodes of {spec.resources.processes} rank(s); rendezvous at "
                f"{endpoint}")
        peers.announce(endpoint, secret, order.model_copy(update={"resume_dir": None}))
        ranks.wait_until_ready()
        return ranks, RankGroup.join(store, RankSeat(0, order.world_size, order.device_type), secret, seed=spec.seed,
                                     sharded=spec.resources.strategy == "fsdp")
    except BaseException as exc:
        explained = ranks.explain(exc)
        ranks.kill()
        if explained is exc:
            raise
        raise explained from exc


def start_node(order: GroupOrder, node: int, endpoint: str, secret: str, log: Callable[[str], None],
               forkserver: Any, store_url: Optional[str] = None) -> Ranks:
    """A multi-node attempt's node ``node`` (1..N-1): its ranks, with their global numbers, meeting at the
    leader's ``endpoint``, forked from the worker's ``forkserver`` (a multiprocessing context:
    ``forked_ranks``). The worker watches them (``baton.workers.queue.gang_follower``)."""
    per_node = order.spec.resources.processes
    first = node * per_node
    return Ranks(order, range(first, first + per_node), Meeting(secret, endpoint=endpoint), log,
                 on_hang=lambda why: None, start=forked_ranks.starter(forkserver), store_url=store_url)
