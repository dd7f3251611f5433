"""The socket `baton ui` and `baton server` listen on: every connection it accepts has TCP_NODELAY (asyncio sets it
only on a socket named TCP), so a kept-alive connection, a browser's or a client's, never waits on Nagle's
algorithm (~40 ms on every response, against the client's delayed ACK)."""
from __future__ import annotations

import asyncio
import socket

import baton.cli  # noqa: F401  (first: the commands register in the CLI's order, which docs/cli.md follows)
from baton.commands.dashboard import _bind


def test_every_accepted_connection_has_tcp_nodelay():
    listening = _bind("127.0.0.1", 0)
    port = listening.getsockname()[1]
    async def accept_one() -> int:
        accepted: asyncio.Future = asyncio.get_running_loop().create_future()

        class Protocol(asyncio.Protocol):
            def connection_made(self, transport):  # type: ignore[override]
                accepted.set_result(transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        server = await asyncio.get_running_loop().create_server(Protocol, sock=listening)
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        nodelay = await asyncio.wait_for(accepted, 30)
        writer.close()
        server.close()
        await server.wait_closed()
        return nodelay

    nodelay = asyncio.run(accept_one())
    assert nodelay != 0, nodelay
