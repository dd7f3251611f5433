"""A local HTTP server standing in for a cloud's metadata service: each path answers 404 (no notice)
until the test gives it a notice; ``/latest/api/token`` hands out IMDSv2 tokens, and a path may
require one (answers 401 without it), as AWS's does with IMDSv2 required."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class NoticeServer:
    TOKEN = "test-imds-token"

    def __init__(self) -> None:
        self.notices: dict[str, tuple[int, str]] = {}  # path -> (status, body)
        self.token_paths: set[str] = set()
        self.requests: list[tuple[str, str, dict]] = []  # (method, path, headers)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_PUT(self) -> None:
                server.requests.append(("PUT", self.path, dict(self.headers)))
                self._answer(200, server.TOKEN) if self.path == "/latest/api/token" else self._answer(404, "")

            def do_GET(self) -> None:
                server.requests.append(("GET", self.path, dict(self.headers)))
                if self.path in server.token_paths and self.headers.get("X-aws-ec2-metadata-token") != server.TOKEN:
                    return self._answer(401, "")
                self._answer(*server.notices.get(self.path, (404, "")))

            def _answer(self, status: int, body: str) -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
