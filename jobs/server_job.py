"""A handle on one job through the pool's server (``ServerClient.job``, ``submit``): what ``Job`` does, each
call one request the server checks against the user's role."""
from __future__ import annotations

import io
import json
import tarfile
import time
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from baton.jobs.job import Job
from baton.jobs.server_views import as_status
from baton.schemas.errors import ServerError
from baton.schemas.status import JobStatus
from baton.storage import plain_tar

if TYPE_CHECKING:
    from baton.jobs.server_client import ServerClient


class ServerJob(Job):
    """A handle on one job through the server: what ``Job`` does, each call a request."""

    client: ServerClient  # type: ignore[assignment]

    def __init__(self, client: ServerClient, job_id: str):
        super().__init__(client, job_id)  # type: ignore[arg-type]

    def _path(self, tail: str = "") -> str:
        return f"/api/jobs/{urllib.parse.quote(self.id, safe='')}{tail}"

    def status(self) -> JobStatus:
        return as_status(self.client.call("GET", self._path("/status")))

    def events(self) -> list:
        from baton.storage.records.events import Event

        return [Event(**event) for event in self.client.call("GET", self._path("/events"))["events"]]

    def cancel(self) -> str:
        return self.client.call("POST", self._path("/cancel"))["result"]

    def resume(self, pause_at: Optional[int] = None) -> int:
        try:
            return self.client.call("POST", self._path("/resume"), {} if pause_at is None else {"pause_at": pause_at})["attempt"]
        except ServerError as exc:
            if exc.status == 409:
                raise ValueError(str(exc).split(": ", 2)[-1]) from None
            raise

    def set_priority(self, priority: int) -> None:
        try:
            self.client.call("POST", self._path("/priority"), {"priority": priority})
        except ServerError as exc:
            if exc.status in (409, 422):
                raise ValueError(str(exc).split(": ", 2)[-1]) from None
            raise

    def metrics(self) -> list[dict]:
        return self.client.call("GET", self._path("/metrics"))["rows"]

    def logs(self, attempt: Optional[int] = None) -> str:
        return self.client.call("GET", self._path("/log" + (f"?attempt={int(attempt)}" if attempt is not None else "")))["text"]

    def follow_logs(self, write: Callable[[str], None] = lambda text: print(text, end="", flush=True),
                    attempt: Optional[int] = None, poll_s: float = 2.0) -> JobStatus:
        """As ``Job.follow_logs``: each poll reads again from the last chunk seen (it may have grown) and
        writes what is new."""
        chunk, written = 0, 0  # the chunk that may still grow, and how much of it (and after it) is written
        query = f"&attempt={int(attempt)}" if attempt is not None else ""
        while True:
            done = self.status().state.terminal
            answer = self.client.call("GET", self._path(f"/log?since={chunk}{query}"))
            if len(answer["text"]) > written:
                write(answer["text"][written:])
            if answer["sizes"]:
                chunk, written = chunk + len(answer["sizes"]) - 1, answer["sizes"][-1]
            if done:
                return self.status()
            time.sleep(poll_s)

    def report(self) -> dict:
        return json.loads(self.client.call("GET", self._path("/artifacts/report"), raw=True))

    def download(self, directory: str | Path = ".", which: str = "best") -> Path:
        """As ``Job.download``: the server verifies each file against its manifest's sha256 and sends them
        as one archive, unpacked here under ``directory/JOB_ID``."""
        content = self.client.call("GET", self._path(f"/fetch/{urllib.parse.quote(which, safe='')}"), raw=True)
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(content)) as tar:
            names = tar.getnames()
            plain_tar.extract(tar, out)  # (no absolute paths, no '..', no links)
        return out / min(names, key=len) if names else out / self.id
