"""A machine's preemption notice, read before its SIGTERM comes: ``BATON_PREEMPTION_NOTICE_URL`` is polled
every second, and a notice shuts the worker down as a first SIGTERM does (``preemption.py``): the job
checkpoints at its next step, commits and goes back to the queue, losing nothing, while the machine
still has its warning time (AWS: two minutes; GCP: 30 seconds).

A notice is an answer 200 whose body is not empty and not ``FALSE``: AWS's ``spot/instance-action``
answers 404 until an action is scheduled, then 200 with it; GCP's ``instance/preempted`` answers 200
``FALSE``, then ``TRUE``. Every request carries ``Metadata-Flavor: Google`` (GCP requires it, AWS
ignores it); an answer 401 (AWS with IMDSv2 required) is retried with a session token from the same
host's ``/latest/api/token``. Anything else (an error, no answer) is no notice: the poller goes on.
"""
from __future__ import annotations

import http.client
import logging
import threading
import urllib.error
import urllib.request
from typing import Callable, Optional
from urllib.parse import urlsplit

_log = logging.getLogger("baton.worker")

POLL_S = 1.0
TIMEOUT_S = 2.0
AWS_TOKEN_TTL_S = 21600


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""The metadata service is the machine's own: never asked through HTTP(S)_PROXY (a proxy would answer
with its own machine's notices, and an IMDSv2 token would travel to it)."""


def notice(url: str, token: Optional[str] = None) -> tuple[Optional[str], int]:
    """(the notice's body, or None when there is none; the HTTP status, 0 when nothing answered)."""
    headers = {"Metadata-Flavor": "Google"}
    if token:
        headers["X-aws-ec2-metadata-token"] = token
    try:
        with _DIRECT.open(urllib.request.Request(url, headers=headers), timeout=TIMEOUT_S) as answer:
            body = answer.read(4096).decode("utf-8", "replace").strip()
            return (body if body and body.upper() != "FALSE" else None), answer.status
    except urllib.error.HTTPError as exc:
        return None, exc.code
    except (OSError, ValueError, http.client.HTTPException):  # a torn or garbled answer is no notice either
        return None, 0


def aws_token(url: str) -> Optional[str]:
    """An IMDSv2 session token from the host of ``url``; None when it gives none."""
    parts = urlsplit(url)
    request = urllib.request.Request(f"{parts.scheme}://{parts.netloc}/latest/api/token", method="PUT",
                                     headers={"X-aws-ec2-metadata-token-ttl-seconds": str(AWS_TOKEN_TTL_S)})
    try:
        with _DIRECT.open(request, timeout=TIMEOUT_S) as answer:
            return answer.read(1024).decode().strip() or None
    except (OSError, ValueError, http.client.HTTPException):
        return None


class NoticePoller(threading.Thread):
    """Polls ``url`` every ``every_s``; calls ``on_notice(body)`` once, at the first notice."""

    def __init__(self, url: str, on_notice: Callable[[str], None], every_s: float = POLL_S):
        super().__init__(name="baton-spot-notice", daemon=True)
        self.url, self.on_notice, self.every_s = url, on_notice, every_s
        self._stopping = threading.Event()
        self._token: Optional[str] = None

    def run(self) -> None:
        while not self._stopping.wait(self.every_s):
            body, status = notice(self.url, self._token)
            if status == 401:
                self._token = aws_token(self.url)
                body, status = notice(self.url, self._token)
            if body is not None:
                _log.warning("preemption notice from %s: %s", self.url, body[:200])
                self.on_notice(body)
                return

    def stop(self) -> None:
        self._stopping.set()
