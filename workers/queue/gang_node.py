"""What a multi-node job's leader and followers share: how nodes are told apart and reached, a place in
the gang kept renewed, and calls on the gang's record that may fail."""
from __future__ import annotations

import logging
import socket
import threading
from typing import Callable, Optional, TypeVar

import redis

_log = logging.getLogger("baton.worker")
T = TypeVar("T")

POLL_S = 0.1
"""How often a leader looks for its gang to fill, and a follower for its gang to start."""

def node_address(settings) -> str:
    """Where this worker is reached by other nodes: BATON_NODE_ADDRESS, else the address of the
    interface its default route leaves by (a host name often resolves to loopback: 127.0.1.1 on
    Debian), else its host name."""
    if settings.node_address:
        return settings.node_address
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # a UDP "connect" sends nothing: it only chooses the route
            address = probe.getsockname()[0]
        if not address.startswith("127."):
            return address
    except OSError:
        pass
    return socket.gethostname()


def node_host() -> str:
    """What tells this worker's host from another's (gangs' nodes are distinct hosts): its host name,
    the pod's name on Kubernetes."""
    return socket.gethostname()


def quietly(call: Callable[[], T]) -> Optional[T]:
    """A call on the gang's record that may fail: the leader still learns what happened (its collective
    breaks, or this node's lease lapses), a status goes without a detail."""
    try:
        return call()
    except redis.RedisError as exc:
        _log.warning("could not reach the gang's record (%s)", exc)
        return None


class Renewer(threading.Thread):
    """Calls ``renew`` every ``every_s`` until stopped; ``lost`` once a renewal says the place is gone."""

    def __init__(self, renew: Callable[[], bool], every_s: float):
        super().__init__(name="baton-gang-renewal", daemon=True)
        self._renew, self._every_s = renew, every_s
        self._stopping = threading.Event()
        self.lost = threading.Event()

    def run(self) -> None:
        while not self._stopping.wait(self._every_s):
            try:
                if not self._renew():
                    self.lost.set()
                    return
            except Exception as exc:  # noqa: BLE001 - Redis away: try again next period
                _log.warning("gang renewal failed (%s); trying again", exc)

    def stop(self) -> None:
        self._stopping.set()
