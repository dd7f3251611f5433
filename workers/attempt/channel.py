"""What crosses between a worker and the training process it runs an attempt in (``process.py``).

One duplex pipe carries messages, each a tuple ``(kind, id, body)``:
- ``tell``: the training process reports (a log line, a step's progress, a commit...); no reply;
- ``call``/``reply``: the training process asks and waits for the answer (the fence before a commit,
  and a multi-node leader's peers: ``baton.workers.parallel.nodes.LeaderPeers``);
- ``end``: how the attempt ended (``AttemptEnd``), the training process's last message;
- ``stacks``: the worker asks for every thread's stack (its stall watchdog), and a thread of the
  training process answers, whatever its loop is doing.
Progress is sent at most every ``STEP_REPORT_EVERY_S`` (with the steps made since), so a fast loop
does not spend its time in the pipe. The training process's messages travel as JSON, each checked by
the worker against the one shape it may have (``wire``: the job's code shares that process, and a
pickle from it would run code in the worker); the worker's replies (a call's value, or its exception:
``FencedOut``) are pickled: the training process trusts its worker.

Why to stop (preempted, cancelled, fenced out) does not travel as a message: the loop asks after
every optimizer step, so the worker keeps the answer in a shared byte (``StopFlag``) that the loop
reads without a system call. When the worker's end of the pipe closes (the worker died), the
training process ends at once (``os._exit``): no attempt outlives the worker that holds its lease.
"""
from __future__ import annotations

import itertools
import logging
import os
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any, Callable, Optional

from baton.schemas.errors import FencedOut
from baton.schemas.manifest import CheckpointManifest
from baton.schemas.messages import AttemptEnd
from baton.storage.checkpointing.contract import CheckpointStats
from baton.workers.training.control import LoopControl, StepReport, describe_row

from baton.workers.attempt import wire
from baton.workers.attempt.process_tree import kill_descendants

_log = logging.getLogger("baton.worker")

STEP_REPORT_EVERY_S = 0.1
"""Least time between two progress messages (the last step of a run is always sent)."""
EXIT_WORKER_GONE = 71
"""The training process's exit status when its worker's end of the pipe closed."""

STOP_REASONS = {0: None, 1: "preempted", 2: "cancelled", 4: "yielded"}  # what a worker's control says (control.LoopControl)
FENCED = 3
CODES = {reason: code for code, reason in STOP_REASONS.items() if reason is not None}


class StopFlag:
    """A shared byte: the worker writes why to stop, the training process's loop reads it."""

    def __init__(self, raw):  # a multiprocessing RawValue('b'), made by the worker's context
        self.raw = raw

    def set(self, reason: Optional[str], fenced: bool = False) -> None:
        self.raw.value = FENCED if fenced else CODES.get(reason, 0) if reason is not None else 0

    def read(self) -> tuple[Optional[str], bool]:
        """(why to stop or None, whether fenced out)."""
        code = self.raw.value
        return (None, True) if code == FENCED else (STOP_REASONS.get(code), False)


class Remote:
    """The training process's end: sends, calls (one reply per call, matched by id, from any thread)."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._waiting: dict[int, list] = {}  # id -> [event, reply]
        self._lock = threading.Lock()
        threading.Thread(target=self._receive, name="baton-channel", daemon=True).start()

    def tell(self, method: str, *args: Any) -> None:
        self._send(("tell", 0, (method, args)))

    def call(self, method: str, *args: Any) -> Any:
        """Ask the worker; its reply's value, or its exception (FencedOut...) raised here."""
        call_id, done = next(self._ids), threading.Event()
        with self._lock:
            self._waiting[call_id] = [done, None]
        self._send(("call", call_id, (method, args)))
        done.wait()
        with self._lock:
            ok, value = self._waiting.pop(call_id)[1]
        if not ok:
            raise value
        return value

    def end(self, body: AttemptEnd) -> None:
        self._send(("end", 0, body))

    def _send(self, message: tuple) -> None:
        data = wire.encode(message)
        with self._send_lock:
            self.conn.send_bytes(data)

    def _receive(self) -> None:
        try:
            self._receive_until_closed()
        except BaseException:  # noqa: BLE001 - a message it cannot read: a call would wait for ever
            traceback.print_exc()
        kill_descendants()  # a DataLoader worker hung in dataset code has no worker left to reap it
        os._exit(EXIT_WORKER_GONE)  # the worker is gone (or unreachable): so is this attempt

    def _receive_until_closed(self) -> None:
        while True:
            try:
                kind, call_id, body = self.conn.recv()
            except (EOFError, OSError):
                return
            if kind == "reply":
                with self._lock:
                    waiting = self._waiting.get(call_id)
                if waiting is not None:
                    waiting[1] = body
                    waiting[0].set()
            elif kind == "stacks":  # the worker's stall watchdog: this thread answers, whatever the loop does
                self._send(("stacks", 0, thread_stacks()))


class RemoteControl(LoopControl):
    """The loop's control in the training process: asks the worker through the channel. Log lines
    stay here (``log``): the job's own log captures this process's output and tees it to the worker's."""

    def __init__(self, remote: Remote, stop: StopFlag, job_id: str):
        self.remote, self.stop, self.job_id = remote, stop, job_id
        self._last_sent = 0.0
        self._unsent_steps = 0
        self.step_now: Optional[int] = None  # the last optimizer step completed (reports are spaced out)

    def stop_reason(self) -> Optional[str]:
        reason, fenced = self.stop.read()
        if fenced:
            raise FencedOut(f"job {self.job_id}: this attempt's lease was lost")
        return reason

    def on_step(self, report: StepReport) -> None:
        self.step_now = report.step
        self._unsent_steps += 1
        now = time.monotonic()
        if now - self._last_sent >= STEP_REPORT_EVERY_S or report.step == report.total_steps:
            self.remote.tell("on_step", report, self._unsent_steps)
            self._last_sent, self._unsent_steps = now, 0

    def on_epoch(self, row: dict) -> None:
        self.log(describe_row(row))
        self.remote.tell("on_epoch", row)

    def on_resume(self, step: int, epoch: int, batch_in_epoch: int, attempt: int, source: str = "checkpoint") -> None:
        super().on_resume(step, epoch, batch_in_epoch, attempt, source)  # the line, in the job's log
        self.remote.tell("on_resume", step, epoch, batch_in_epoch, attempt, source)

    def log(self, message: str) -> None:
        """Into this process's log: the job's own log captures it, and passes it on to the worker's."""
        _log.info("job %s: %s", self.job_id, message)

    def fence(self) -> None:
        self.remote.call("fence")

    def on_commit(self, manifest: CheckpointManifest, stats: CheckpointStats) -> None:
        self.remote.tell("on_commit", manifest, stats)


def thread_stacks() -> str:
    """Every thread's current stack, named, as faulthandler would print them."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    return "\n".join(f"Thread {names.get(ident, '?')} ({ident}), most recent call last:\n"
                     + "".join(traceback.format_stack(frame))
                     for ident, frame in sys._current_frames().items())


def serve(message: tuple, handlers: dict[str, Callable[..., Any]], send: Callable[[tuple], None]) -> None:
    """The worker's end: run one ``tell``/``call`` message's handler; a call's result (or the exception
    it raised, FencedOut included) goes back as its reply."""
    kind, call_id, (method, args) = message
    if kind == "tell":
        handlers[method](*args)
        return
    try:
        reply = (True, handlers[method](*args))
    except (Exception, FencedOut) as exc:  # noqa: BLE001 - raised in the training process instead
        reply = (False, exc)
    send(("reply", call_id, reply))
