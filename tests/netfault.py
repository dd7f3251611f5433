"""A TCP proxy on loopback that can hold or cut the connection to a real server: network faults
between baton and its S3 endpoint, without touching either side.

- ``pass``: bytes flow both ways.
- ``hold``: bytes from clients are read but kept back (counted in ``held_bytes``): an upload
  that starts now stays in flight, unfinished, until ``pass`` again.
- ``cut``: every open connection is closed and new ones are closed on accept (the client sees
  its connections reset: the endpoint is unreachable).
"""
from __future__ import annotations

import socket
import threading


class FaultyProxy:
    def __init__(self, target_port: int):
        self.target_port = target_port
        self.mode = "pass"
        self.held_bytes = 0
        self.held_starts: list[bytes] = []  # the first bytes of each chunk held back
        self._lock = threading.Lock()
        self._released = threading.Condition(self._lock)
        self._releases = 0  # counts the moves out of "hold": a held pump waits for the next one
        self._conns: list[socket.socket] = []
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set(self, mode: str) -> None:
        assert mode in ("pass", "hold", "cut")
        with self._lock:
            if self.mode == "hold" and mode != "hold":
                self._releases += 1
                self._released.notify_all()
            self.mode = mode
            if mode == "hold":
                self.held_bytes = 0
                self.held_starts = []
            if mode == "cut":
                for conn in self._conns:
                    self._close(conn)
                self._conns.clear()

    def close(self) -> None:
        self._closed = True
        self.set("cut")
        self._listener.close()

    @staticmethod
    def _close(sock: socket.socket) -> None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.mode == "cut":
                self._close(client)
                continue
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                self._close(client)
                continue
            with self._lock:
                self._conns += [client, server]
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_client: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if from_client and self.mode == "hold":
                    with self._lock:
                        self.held_bytes += len(data)
                        self.held_starts.append(data[:200])
                        held_at = self._releases
                        self._released.wait_for(lambda: self._releases != held_at)
                if self.mode == "cut":
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self._close(src)
            self._close(dst)
