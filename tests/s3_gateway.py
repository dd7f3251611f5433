"""An HTTP gateway in front of moto's S3 server, for faults that need to see requests.

- ``ignore_conditions=True``: strips ``If-None-Match``/``If-Match`` from every request before it
  reaches the server. That is how S3-compatible stores without conditional writes behave: they
  do not refuse the condition, they ignore it and overwrite.
- ``hold(predicate)``: a request for which ``predicate(method, path)`` is true waits (unanswered,
  its body read) until ``release()``: a client frozen at an exact point of its protocol.
  ``seen`` lists every request as ``(method, path)`` in arrival order. ``discard()`` instead of
  ``release()``: every held request is dropped unanswered, never forwarded (what a client killed
  while held had sent never reaches the server, as with a client killed before its request left).
- ``access_keys={...}``: a request signed with any other access key id is refused as S3 refuses an
  unknown key (403 ``InvalidAccessKeyId``); moto's server accepts every key.
"""
from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Optional

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}
_CONDITIONS = {"if-none-match", "if-match"}


class _Gate:
    def __init__(self) -> None:
        self.opened = threading.Event()
        self.discarded = False


class S3Gateway:
    def __init__(self, target_port: int, ignore_conditions: bool = False, access_keys: Optional[set[str]] = None):
        self.target_port = target_port
        self.ignore_conditions = ignore_conditions
        self.access_keys = access_keys
        self.seen: list[tuple[str, str]] = []
        self.held: list[tuple[str, str]] = []
        self._predicate: Optional[Callable[[str, str], bool]] = None
        self._gate: Optional[_Gate] = None  # where the requests held now wait
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def hold(self, predicate: Callable[[str, str], bool]) -> None:
        with self._lock:
            self._predicate = predicate
            if self._gate is None:
                self._gate = _Gate()

    def release(self) -> None:
        self._open(discard=False)

    def discard(self) -> None:
        self._open(discard=True)

    def _open(self, discard: bool) -> None:
        with self._lock:
            self._predicate = None
            gate, self._gate = self._gate, None
        if gate is not None:
            gate.discarded = discard
            gate.opened.set()

    def close(self) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()

    def _passes(self, method: str, path: str) -> bool:
        """Whether a request goes on to the server: at once, or once its hold is released (not discarded)."""
        with self._lock:
            self.seen.append((method, path))
            if self._predicate is None or not self._predicate(method, path):
                return True
            self.held.append((method, path))
            gate = self._gate
        gate.opened.wait()
        return not gate.discarded

    def _handler(self):
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _body(self) -> bytes:
                if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                    chunks = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return b"".join(chunks)
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))

            def _refused(self) -> bool:
                signed = self.headers.get("Authorization", "")
                key = signed.split("Credential=", 1)[1].split("/", 1)[0] if "Credential=" in signed else ""
                if gateway.access_keys is None or key in gateway.access_keys:
                    return False
                error = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InvalidAccessKeyId</Code><Message>The AWS '
                         b'Access Key Id you provided does not exist in our records.</Message></Error>')
                self.send_response(403, "Forbidden")
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", "0" if self.command == "HEAD" else str(len(error)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(error)
                return True

            def _forward(self) -> None:
                body = self._body()
                if self._refused():
                    return
                if not gateway._passes(self.command, self.path):
                    self.close_connection = True  # dropped: no answer, the connection closed
                    return
                drop = _HOP_BY_HOP | (_CONDITIONS if gateway.ignore_conditions else set())
                headers = {k: v for k, v in self.headers.items() if k.lower() not in drop | {"content-length"}}
                if body or self.command in ("PUT", "POST"):
                    headers["Content-Length"] = str(len(body))
                upstream = http.client.HTTPConnection("127.0.0.1", gateway.target_port, timeout=60)
                try:
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    response = upstream.getresponse()
                    data = response.read()
                    self.send_response(response.status, response.reason)
                    for key, value in response.getheaders():
                        if key.lower() not in _HOP_BY_HOP and not (key.lower() == "content-length" and self.command != "HEAD"):
                            self.send_header(key, value)
                    if self.command != "HEAD":
                        self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                finally:
                    upstream.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        return Handler
