"""A job's own log: every line an attempt produces, kept with the job in object storage.

What is captured: the process's file descriptors 1 and 2, for the whole attempt. So baton's loop
log (a worker's ``baton.*`` logging, ``baton run``'s lines), the user code's ``print``, its Python
logging to the console, warnings, C/C++ output, and the output of every child process started
meanwhile (DataLoader workers, a DDP rank) all land in it. The bytes still reach the console
(the worker's own log) through a tee; only the stored copy is cut into lines, stamped with UTC time
and the stream, and cleaned of carriage-return overwrites (a progress bar keeps its last state).

Secrets never reach the stored log, nor the tee: values of environment variables whose names say
they are secret (``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``*PASSWORD*``, ``*TOKEN*``, ...)
and the password of any ``scheme://user:password@host`` URL (``BATON_REDIS_URL``, an MLflow URI)
are replaced by ``***``; so is any such password in any line.

Where: ``jobs/<id>/attempt-<n>/logs/<chunk>.log`` (``JobPaths.log_chunk``), under the attempt's own
prefix, so no other attempt ever writes there, and a reader lists the job's attempts' chunks in
order. Each flush (every ``FLUSH_S`` while new lines arrived, and at the end) rewrites the current
chunk whole (an atomic put: a reader sees the old or the new one); at ``CHUNK_BYTES`` the chunk is
left as is and the next begins. Rewriting rather than appending small parts keeps the object
count at one per MiB of log (not one per flush: a week-long job would leave 10^5 parts to list),
while no flush uploads more than a MiB. A SIGKILLed attempt loses at most its last ``FLUSH_S``.

Capturing never fails or slows a job: a reader thread copies the pipes, a flusher thread uploads;
an upload that fails is logged once per outage, counted
(``baton_tracking_failures_total{tracker="logs"}``) and retried at the next flush.
"""
from __future__ import annotations

import codecs
import logging
import os
import select
import sys
import threading
import time
from datetime import datetime, timezone
from typing import Mapping, Optional

from baton.storage.job_log import BATON_STREAM, END_MARKER
from baton.storage.redaction import Redactor
from baton.storage.stores.base import ObjectStore
from baton.storage.layout import JobPaths

from baton.workers.tracking import prometheus

_log = logging.getLogger("baton.joblogs")

TRACKER = "logs"
FLUSH_S = 2.0
"""Longest a line waits before it is in object storage (``baton logs -f`` shows it then)."""
CHUNK_BYTES = 1 << 20
"""A chunk object grows to this, then the next one begins."""
UNSENT_MAX_BYTES = 64 << 20
"""Full chunks kept in memory while the store is away; past it the oldest are dropped (and said so)."""
PARTIAL_MAX_BYTES = 64 << 10
"""Most of an unfinished line kept (a progress bar redrawn with \\r and never ended)."""
CLOSE_WAIT_S = 10.0
"""Longest an attempt waits at its end for its last flush."""

def stamp(now: Optional[float] = None) -> str:
    """UTC time to the millisecond: ``2026-11-22T07:54:19.875Z``."""
    moment = datetime.fromtimestamp(time.time() if now is None else now, timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class _Chunks:
    """The attempt's log as numbered chunks; the flusher uploads those that changed."""

    def __init__(self, store: ObjectStore, paths: JobPaths):
        self.store, self.paths = store, paths
        self.lock = threading.Lock()
        self.number = 0
        self.current = bytearray()
        self.sealed: list[tuple[int, bytes]] = []  # full chunks not uploaded yet
        self.dirty = False
        self.dropped = 0

    def add(self, line: str) -> None:
        data = (line + "\n").encode("utf-8", errors="replace")
        with self.lock:
            if self.current and len(self.current) + len(data) > CHUNK_BYTES:
                self.sealed.append((self.number, bytes(self.current)))
                self.number, self.current = self.number + 1, bytearray()
                while sum(len(b) for _, b in self.sealed) > UNSENT_MAX_BYTES:
                    self.dropped += len(self.sealed.pop(0)[1])
            self.current += data
            self.dirty = True

    def flush(self) -> None:
        """Upload the full chunks not yet uploaded, then the current one (raises what the store raises)."""
        with self.lock:
            sealed, current, number, dirty = list(self.sealed), bytes(self.current), self.number, self.dirty
            self.dirty = False
        try:
            for n, data in sealed:
                self.store.put_bytes(self.paths.log_chunk(n), data)
                with self.lock:
                    self.sealed.remove((n, data))
            if dirty and current:
                self.store.put_bytes(self.paths.log_chunk(number), current)
        except BaseException:
            with self.lock:
                self.dirty = self.dirty or dirty
            raise


EXIT_WAIT_S = 1.0
"""How long a process leaving at once (grace period over, a hung job) waits for its log's last upload."""

_capturing: set["JobLogCapture"] = set()  # started and not yet closed (a worker process runs one job at a time)
_capturing_lock = threading.Lock()


def close_all_before_exit(why: str) -> None:
    """Called just before ``os._exit``: whatever is still in a capture's pipes (the exit's own log
    lines among them) reaches the console and the stored log, and fds 1 and 2 are the console
    again, instead of dying in a pipe nobody reads any more."""
    with _capturing_lock:
        active = list(_capturing)
    for capture in active:
        capture.close(f"the process exited: {why}", wait_s=EXIT_WAIT_S)


class JobLogCapture:
    """Tees fds 1 and 2 into the attempt's log while it runs. ``start()``, then ``close(ending)``."""

    def __init__(self, store: ObjectStore, paths: JobPaths, environ: Mapping[str, str] = os.environ):
        self.paths = paths
        self.redact = Redactor(environ)
        self.chunks = _Chunks(store, paths)
        self._saved: dict[int, int] = {}
        self._pipes: dict[int, tuple[int, int]] = {}  # fd -> (read end, write end)
        self._partial: dict[int, bytes] = {1: b"", 2: b""}
        self._console_partial: dict[int, bytes] = {1: b"", 2: b""}  # the console copy, cut at line ends too
        self._decoders = {fd: codecs.getincrementaldecoder("utf-8")(errors="replace") for fd in (1, 2)}
        self._stop = threading.Event()  # the reader's: the attempt is over
        self._final = threading.Event()  # the flusher's: the end marker is written, flush a last time
        self._failing = False
        self._reader: Optional[threading.Thread] = None
        self._line_buffering = False
        self._flusher: Optional[threading.Thread] = None

    # --- the attempt's side -------------------------------------------------------------------------
    def start(self, header: str) -> "JobLogCapture":
        self.line(BATON_STREAM, header)
        _flush_python_streams()
        try:  # every descriptor first: a half-done redirect would leave a pipe that nobody reads
            for fd in (1, 2):
                self._saved[fd] = os.dup(fd)
                self._pipes[fd] = os.pipe()
        except OSError:
            for opened in [*self._saved.values(), *(end for pipe in self._pipes.values() for end in pipe)]:
                os.close(opened)
            raise
        for fd, (_, write_end) in self._pipes.items():
            os.dup2(write_end, fd)
        self._line_buffering = _line_buffered(True)  # a print reaches the log when its line ends, not 8 KiB later
        self._reader = threading.Thread(target=self._read, name=f"baton-joblog-read-{self.paths.job_id}", daemon=True)
        self._flusher = threading.Thread(target=self._flush_loop, name=f"baton-joblog-flush-{self.paths.job_id}",
                                         daemon=True)
        self._reader.start()
        self._flusher.start()
        with _capturing_lock:
            _capturing.add(self)
        return self

    def line(self, stream: str, text: str) -> None:
        """One line into the log (not the console), redacted and stamped."""
        self.chunks.add(f"{stamp()} {stream} {self.redact(text)}")

    def close(self, ending: str, wait_s: float = CLOSE_WAIT_S) -> None:
        """Stop capturing, write the end marker, flush once more (at most ``wait_s``). Once only."""
        with _capturing_lock:
            if self not in _capturing:
                return
            _capturing.discard(self)
        _flush_python_streams()
        _line_buffered(self._line_buffering)
        for fd, saved in self._saved.items():
            os.dup2(saved, fd)
        for _, write_end in self._pipes.values():
            os.close(write_end)  # a child still holding a copy keeps the pipe open: the reader stops on its own
        self._stop.set()
        if self._reader is not None:
            self._reader.join(2.0)
        for fd, rest in self._partial.items():
            if rest:
                self.line("stdout" if fd == 1 else "stderr", _shown(rest))
        for fd, rest in self._console_partial.items():
            if rest and (self._reader is None or not self._reader.is_alive()):
                self._to_console(fd, rest)
        self.line(BATON_STREAM, END_MARKER.format(attempt=self.paths.attempt) + ending)
        self._final.set()
        if self._flusher is not None:
            self._flusher.join(wait_s)
        if self._reader is None or not self._reader.is_alive():  # else it may still write to them: leave them open
            for saved in self._saved.values():
                os.close(saved)
        if self._flusher is not None and self._flusher.is_alive():
            prometheus.TRACKING_FAILURES.labels(TRACKER).inc()
            _log.warning("job %s: the last lines of its log were not stored within %.0fs", self.paths.job_id, wait_s)

    # --- the reader thread: pipes -> console and log ---------------------------------------------------
    def _read(self) -> None:
        readers = {read_end: fd for fd, (read_end, _) in self._pipes.items()}
        stopped_at = None
        try:
            while readers:
                ready, _, _ = select.select(list(readers), [], [], 0.1)
                if self._stop.is_set():  # drain what is there, but a child that goes on writing cannot hold us
                    stopped_at = stopped_at or time.monotonic()
                    if not ready or time.monotonic() - stopped_at > 0.5:
                        return
                for read_end in ready:
                    data = os.read(read_end, 65536)
                    if not data:
                        del readers[read_end]
                        continue
                    self._take(readers[read_end], data)
        finally:
            for read_end, _ in self._pipes.values():
                os.close(read_end)

    def _take(self, fd: int, data: bytes) -> None:
        # the console copy is redacted by whole lines (or \r-ended progress lines): a secret split
        # between two reads is still found; a very long unended line goes out as it is
        console = self._console_partial[fd] + data
        cut = max(console.rfind(b"\n"), console.rfind(b"\r")) + 1
        if cut == 0 and len(console) > PARTIAL_MAX_BYTES:
            cut = len(console)
        self._console_partial[fd] = console[cut:]
        if cut:
            self._to_console(fd, console[:cut])
        *lines, rest = (self._partial[fd] + data).split(b"\n")
        self._partial[fd] = rest if len(rest) <= PARTIAL_MAX_BYTES else rest[rest.rfind(b"\r") + 1:][-PARTIAL_MAX_BYTES:]
        stream = "stdout" if fd == 1 else "stderr"
        for raw in lines:
            self.line(stream, _shown(raw))

    def _to_console(self, fd: int, data: bytes) -> None:
        shown = self.redact(self._decoders[fd].decode(data)).encode()  # a character split between reads stays whole
        try:
            while shown:
                shown = shown[os.write(self._saved[fd], shown):]
        except OSError:
            pass  # the console is gone (a closed terminal): the stored log still gets the line

    # --- the flusher thread: log -> object storage ------------------------------------------------------
    def _flush_loop(self) -> None:
        while True:
            final = self._final.wait(FLUSH_S)
            self._flush_once()
            if final:
                return

    def _flush_once(self) -> None:
        try:
            self.chunks.flush()
        except Exception as exc:  # the log must never fail the job: counted, logged once, retried next flush
            prometheus.TRACKING_FAILURES.labels(TRACKER).inc()
            if not self._failing:
                _log.warning("job %s: its log could not be stored (%s: %s); retried every %.0fs", self.paths.job_id,
                             type(exc).__name__, exc, FLUSH_S)
            self._failing = True
            return
        self._failing = False


def _shown(raw: bytes) -> str:
    """What a terminal shows of a line: the text after its last carriage return (a progress bar's
    last state, not each redraw)."""
    return raw.decode("utf-8", errors="replace").rstrip("\r").rsplit("\r", 1)[-1]


def _flush_python_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, ValueError, OSError):
            pass


def _line_buffered(on: bool) -> bool:
    """Set sys.stdout's line buffering; returns what it was."""
    stream = sys.stdout
    was = bool(getattr(stream, "line_buffering", False))
    if hasattr(stream, "reconfigure"):
        try:
            stream.reconfigure(line_buffering=on)
        except (ValueError, OSError):
            pass
    return was
