"""The local S3 endpoint of the demo and the tests: moto's server, with its conditional writes made atomic.

baton's manifest store relies on S3's conditional PUT (``If-Match``, ``If-None-Match``): of two writers
racing from one version, exactly one wins (as on AWS S3). moto checks the condition and then stores the
object in one of its request threads without a lock, so two racing writers can both win. Here every
conditional PUT runs alone, its response consumed inside the lock; other requests run as moto runs them.

    python -m baton.jobs.local_s3 HOST PORT
"""
from __future__ import annotations

import sys
import threading
from typing import Any, Callable, Iterable

CONDITIONS = ("HTTP_IF_MATCH", "HTTP_IF_NONE_MATCH")


def serialising_conditional_puts(app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    lock = threading.Lock()

    def serve(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") == "PUT" and any(name in environ for name in CONDITIONS):
            with lock:
                return list(app(environ, start_response))
        return app(environ, start_response)
    return serve


def main(host: str, port: int) -> None:
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import run_simple

    run_simple(host, port, serialising_conditional_puts(DomainDispatcherApplication(create_backend_app)),
               threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
