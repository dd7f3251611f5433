"""The writer process: a checkpoint's storage half (``commit_work.py``) in a process of its own.

Why a process: serialization, hashing, the metrics rows, the manifest's JSON and the store's
client are Python work, and a thread doing it holds the GIL against the training loop. On the
spiral example a background thread cost as much per epoch as doing the commit synchronously
(bench/loop_overhead.py); in its own process the commit takes the other core instead.

How it works (DCP's process-based async save works alike):
- The training process copies its state into buffer files both processes map
  (``shared_buffers.py``); the writer serializes straight from them. What crosses the pipe is
  the state's structure with each tensor replaced by the name of its buffer, and the request.
- The fence stays in the training process, which holds the lease: just before the manifest's
  compare-and-swap the writer asks, and the training process answers "go" only if the attempt
  is not cancelled and its fence passes, holding its commit lock until the swap has landed (or
  failed: its retries stop at a cancellation).
- ``cancel`` (the attempt is over) sets a flag in a shared byte, checked before every storage call
  of the writer, retries included (``abandon`` sets it before it waits for the commit lock); then
  the training process asks it to exit and does not wait (an upload in flight finishes as an
  unreferenced object, like the thread writer's).
- The writer ignores SIGINT and SIGTERM (a Ctrl-C reaches the whole process group; the training
  process decides when to stop) and is killed by the kernel if the thread that started it ends
  (PR_SET_PDEATHSIG: the training process's main thread, in baton), and exits when its pipe
  closes.

Started ahead of the checkpointer where it can be (``writer_start.py``: ``baton run`` starts it
before importing torch), else when the checkpointer is created; it imports torch (about 1.8 s of a
core here) before it waits for its configuration. The checkpointer's thread writes the checkpoints
that fall due before it is ``ready``. Checkpoints of CUDA tensors keep the thread writer: their pinned host
buffers cannot be shared files.
"""
from __future__ import annotations

import ctypes
import dataclasses
import mmap
import operator
import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import Future
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable, Optional

from baton.schemas import errors
from baton.schemas.errors import CheckpointCancelled, CheckpointWriteFailed, ManifestAhead

from baton.storage.checkpointing import writer_start
from baton.storage.checkpoint_io import ROWS_KEY
from baton.storage.checkpointing.commit_work import Committed
from baton.storage.checkpointing.contract import CheckpointRequest
from baton.storage.checkpointing.plain import Plain

CANCEL_FILE = "cancelled"


class ProcessWriter:
    """The training process's side: one checkpoint at a time, each a Future of ``Committed``."""

    def __init__(self, config: dict[str, Any], fence: Callable[[], None], commit_lock: threading.Lock,
                 cancelled: threading.Event, log: Callable[[str], None]):
        self.fence, self.commit_lock, self.cancelled, self.log = fence, commit_lock, cancelled, log
        self.ready = threading.Event()  # set once the process has imported what it needs
        cancel_path = Path(config["spool"]) / CANCEL_FILE
        cancel_path.write_bytes(b"\0")
        with open(cancel_path, "r+b") as fh:
            self._cancel_flag = mmap.mmap(fh.fileno(), 1)
        started = writer_start.take(config.get("nice", 0))  # the spare started ahead, when there is one
        self.proc, self._to_child, self._from_child = started.proc, started.to_child, started.from_child
        self._send_lock = threading.Lock()
        self._pending: Optional[tuple[Future, Callable[[Committed], None]]] = None
        self._rows_sent = 0
        self._fence_error: Optional[BaseException] = None
        self._holding_lock = False
        self._gone: Optional[str] = None
        self._send(("init", {**config, "cancel_file": str(cancel_path)}))
        self._reader = threading.Thread(target=self._read, name="baton-writer-reader", daemon=True)
        self._reader.start()

    # --- called by the checkpointer ------------------------------------------------------------
    def submit(self, skeleton: Any, request: CheckpointRequest, key: str,
               finish: Callable[[Committed], None]) -> Future:
        """Have the writer commit ``skeleton`` (the snapshot, its tensors as Slots); ``finish`` runs
        on the reader thread after the commit, before the Future resolves (the on_commit hooks)."""
        future: Future = Future()
        if self._gone is not None:
            future.set_exception(CheckpointWriteFailed(self._gone))
            return future
        self._pending = (future, finish)
        skeleton, request, rows = self._rows_apart(skeleton, request)
        try:
            self._send(("save", skeleton, request, key, rows))
        except OSError:  # it died: the reader thread sees the pipe end and says how
            self._pending = None
            self._reader.join(10)
            if not future.done():  # (the reader thread may have failed it already)
                future.set_exception(CheckpointWriteFailed(self._gone or "the checkpoint writer process is gone"))
        return future

    def _rows_apart(self, skeleton: Any, request: CheckpointRequest) -> tuple[Any, CheckpointRequest, Optional[tuple]]:
        """The metrics rows travel once: the writer keeps those it was sent (an attempt's rows only
        grow) and gets the new ones, ``(start, new rows, whether the request carries them)``."""
        held = skeleton.get(ROWS_KEY) if isinstance(skeleton, dict) else None
        if not isinstance(held, Plain) or not isinstance(held.value, list):
            return skeleton, request, None
        rows = held.value
        carried = request.metrics_rows
        if carried is not None and not (len(carried) == len(rows) and all(map(operator.is_, carried, rows))):
            return skeleton, request, None  # the request's rows are other rows: both go whole
        start = self._rows_sent if self._rows_sent <= len(rows) else 0
        self._rows_sent = len(rows)
        return ({**skeleton, ROWS_KEY: None}, dataclasses.replace(request, metrics_rows=None),
                (start, rows[start:], carried is not None))

    def mark_cancelled(self) -> None:
        """The attempt is over: the writer stops before its next storage call (retries included)."""
        self._cancel_flag[0] = 1

    def cancel(self) -> None:
        """``mark_cancelled``, then ask the writer to exit (it does once its current work stops)."""
        self.mark_cancelled()
        try:
            self._send(("exit",))
        except OSError:
            pass

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Ask the writer to exit (after its checkpoint in flight) and wait for it. One still starting
        (importing torch) holds no checkpoint: it is killed rather than waited for (a preempted attempt
        seconds old would otherwise wait out those imports before handing its job over)."""
        if not self.ready.is_set() and self._pending is None:
            self.proc.kill()
        try:
            self._send(("exit",))
        except OSError:
            pass
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout_s)
        self._to_child.close()

    # --- the reader thread --------------------------------------------------------------------
    def _send(self, message: tuple) -> None:
        with self._send_lock:
            self._to_child.send(message)

    def _read(self) -> None:
        try:
            while True:
                message = self._from_child.recv()
                kind = message[0]
                if kind == "log":
                    self._log(message[1])
                elif kind == "ready":
                    self.ready.set()
                elif kind == "fence":
                    self._answer_fence()
                elif kind == "swapped":
                    self._release_lock()  # the rotation and garbage collection after it need no lock
                elif kind in ("done", "error"):
                    self._resolve(message)
        except (EOFError, OSError):
            pass
        except BaseException as exc:  # a bug here must not leave the loop waiting forever
            self._fail_pending(CheckpointWriteFailed(f"the checkpoint writer's reader failed: {type(exc).__name__}: {exc}"))
            self.proc.kill()
        finally:
            self._release_lock()
            self._from_child.close()
            code = self.proc.wait()
            self._gone = f"the checkpoint writer process (pid {self.proc.pid}) exited with code {code}"
            pending, self._pending = self._pending, None
            if pending is not None and not pending[0].done():
                cause = (CheckpointCancelled("the checkpoint was cancelled: its attempt is over")
                         if self.cancelled.is_set() else
                         CheckpointWriteFailed(f"{self._gone} before its checkpoint was committed"))
                pending[0].set_exception(cause)

    def _answer_fence(self) -> None:
        """Go only if the attempt is still on and its fence passes; the commit lock is held until
        the writer reports the swap's outcome (``abandon`` waits for it)."""
        self.commit_lock.acquire()
        self._holding_lock = True
        self._fence_error = None
        if self.cancelled.is_set():
            self._send(("abort",))
            return
        try:
            self.fence()
        except BaseException as exc:  # FencedOut, LeaseUnconfirmed: the checkpoint fails with it
            self._fence_error = exc
            self._send(("abort",))
            return
        self._send(("go",))

    def _release_lock(self) -> None:
        if self._holding_lock:
            self._holding_lock = False
            self.commit_lock.release()

    def _log(self, message: str) -> None:
        try:
            self.log(message)
        except Exception:  # a closed console: the writer's message is lost, not the reader thread
            pass

    def _fail_pending(self, exc: BaseException) -> None:
        pending, self._pending = self._pending, None
        if pending is not None and not pending[0].done():
            pending[0].set_exception(exc)

    def _resolve(self, message: tuple) -> None:
        self._release_lock()
        fence_error, self._fence_error = self._fence_error, None
        pending, self._pending = self._pending, None
        if pending is None:
            return
        future, finish = pending
        if message[0] == "error":
            self._rows_sent = 0  # what the writer holds is uncertain now: the next save sends every row
            future.set_exception(fence_error or _exception(*message[1:]))
            return
        from baton.schemas.manifest import CheckpointManifest

        _, manifest_json, size, write_s = message
        committed = Committed(CheckpointManifest.model_validate_json(manifest_json), size, write_s)
        try:
            finish(committed)
        except BaseException as exc:
            future.set_exception(exc)
        else:
            future.set_result(committed)


def _described(exc: BaseException) -> tuple[str, str, tuple]:
    """What crosses the pipe of a writer's failure: its type's name, its message, extra arguments."""
    return type(exc).__name__, str(exc), (exc.current,) if isinstance(exc, ManifestAhead) else ()


def _exception(name: str, message: str, extra: tuple) -> BaseException:
    """The failure again, as baton's own error type of that name (nothing else is rebuilt from the
    writer's words). Any other type (a RuntimeError mapping a buffer, a MemoryError serializing) is
    the machine's: no code of the job's runs in the writer, so it is CheckpointWriteFailed naming it,
    a loss, never the job's failure."""
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, (errors.BatonError, errors.FencedOut)) and cls is not errors.SpecError:
        try:
            return cls(message, *extra)
        except TypeError:
            pass
    return CheckpointWriteFailed(f"checkpoint writer: {name}: {message}")


# --- the writer process ----------------------------------------------------------------------
def _die_with(parent_pid: int) -> None:
    """Be killed when the training process dies (Linux), and not by its terminal's signals."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # it died before prctl took effect
        os._exit(0)


def main(argv: list[str]) -> None:
    """``argv``: the pipes' descriptors, the training process's pid, the nice increment. The imports
    come first: a writer started ahead (``writer_start``) is ready when its configuration comes."""
    _die_with(int(argv[3]))
    _lower_priority(int(argv[4]))
    inbox, outbox = Connection(int(argv[1]), writable=False), Connection(int(argv[2]), readable=False)

    import torch

    from baton.storage.checkpointing.shared_buffers import MappedBuffers

    torch.set_num_threads(1)
    try:
        _, config = inbox.recv()
    except EOFError:  # a spare no checkpointer took
        return
    try:
        with open(config["cancel_file"], "r+b") as fh:
            flag = mmap.mmap(fh.fileno(), 1)
    except FileNotFoundError:  # the attempt ended (its spool removed) while this process started: nothing to write
        return
    work = _commit_work(config, inbox, outbox, lambda: flag[0] == 1)
    outbox.send(("ready",))
    _serve(work, MappedBuffers(), inbox, outbox)


def _lower_priority(nice: int) -> None:
    if nice > 0:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, min(19, os.getpriority(os.PRIO_PROCESS, 0) + nice))
        except OSError:
            pass


def _commit_work(config: dict, inbox: Connection, outbox: Connection, cancelled: Callable[[], bool]) -> Any:
    """The commits of ``config``'s attempt, gated by the training process's fence (asked through the pipe)."""
    from baton.storage.checkpointing.commit_work import CommitWork
    from baton.storage.checkpointing.contract import CheckpointTarget
    from baton.storage.layout import JobPaths
    from baton.storage.stores.open import open_store

    def gate(swap: Callable[[], Any]) -> Any:
        outbox.send(("fence",))
        answer = inbox.recv()
        if answer[0] != "go":
            raise CheckpointCancelled("the training process did not let this checkpoint commit")
        try:
            return swap()
        finally:
            outbox.send(("swapped",))

    target = CheckpointTarget(open_store(config["store_url"]), JobPaths(config["job_id"]), config["attempt"],
                              config["keep_last"], upload_retry_s=config["upload_retry_s"],
                              log=lambda message: outbox.send(("log", message)))
    return CommitWork(target, Path(config["spool"]), gate, cancelled)


def _serve(work: Any, buffers: Any, inbox: Connection, outbox: Connection) -> None:
    """Commit each checkpoint the training process sends until it says ``exit`` or its pipe closes."""
    rows: list[dict] = []
    while True:
        try:
            message = inbox.recv()
        except EOFError:
            return
        if message[0] != "save":
            return  # "exit"
        _, skeleton, request, key, new_rows = message
        try:
            if new_rows is not None:  # the rows it holds, and the new ones (ProcessWriter._rows_apart)
                start, added, carried = new_rows
                del rows[start:]
                rows.extend(added)
            state = buffers.from_slots(skeleton)
            if new_rows is not None:
                state[ROWS_KEY] = Plain(list(rows))
                if carried:
                    request = dataclasses.replace(request, metrics_rows=list(rows))
            committed = work.run(state, request, key)
        except BaseException as exc:  # reported to the training process, which decides
            outbox.send(("error", *_described(exc)))
        else:
            outbox.send(("done", committed.manifest.model_dump_json(), committed.size, committed.write_s))


if __name__ == "__main__":
    main(sys.argv)
