"""What the leader of a multi-node attempt offers it (``resources.nodes``): the attempt's side of the
gang that ``baton.workers.queue.gang_runner`` forms and watches."""
from __future__ import annotations

from typing import Optional, Protocol


class GangLeader(Protocol):
    nodes: int
    address: str  # where the other nodes reach this one: its rank 0 serves the rendezvous there
    loss_wait_s: float  # how long a broken collective may take to be explained by another node's report

    def start(self, endpoint: str, secret: str, args: dict) -> None:
        """Publish the rendezvous (``endpoint``, the attempt's ``secret``) and the ranks' arguments:
        the other nodes start their ranks (RankLost if the gang is gone)."""

    def remote_failure(self) -> Optional[BaseException]:
        """What another node reported of its ranks (RankFailed, RankLost), None before."""
