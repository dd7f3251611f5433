"""How jobs look in a terminal: one job in detail, many as a table, a progress line."""
from __future__ import annotations

import datetime as dt
import itertools
import re
import sys
import traceback
from typing import Optional

from baton.schemas.errors import BatonError, UserCodeError, exception_chain
from baton.schemas.status import JobStatus


def _when(stamp: Optional[float]) -> str:
    return dt.datetime.fromtimestamp(stamp).strftime("%Y-%m-%d %H:%M:%S") if stamp else "-"


def _num(value: Optional[float], fmt: str = ".4f") -> str:
    return "-" if value is None else format(value, fmt)


def _epoch(s: JobStatus) -> str:
    if s.epoch is None:
        return f"-/{s.epochs}" if s.epochs else "-"
    return f"{s.epoch}/{s.epochs}" if s.epochs else str(s.epoch)


def progress_line(s: JobStatus) -> str:
    steps = f"{s.step}/{s.total_steps}" if s.total_steps else "-"
    epoch = _epoch(s)
    line = (f"{s.id} {s.state.value} attempt {s.attempt} on {s.worker or '-'}: epoch {epoch} step {steps} "
            f"loss {_num(s.loss)} {_num(s.samples_per_s, '.0f')} samples/s")
    return f"{line}; {s.waiting}" if s.waiting else line


def _metric_rows(s: JobStatus) -> list[tuple[str, str]]:
    """The last validation's metrics, the monitored one first; "-" for the monitor before any validation."""
    metrics = dict(s.metrics) if s.metrics is not None else {
        k: v for k, v in (("val_loss", s.val_loss), ("val_accuracy", s.val_accuracy)) if v is not None}
    names = sorted(metrics, key=lambda name: name != s.monitor)
    if s.monitor is not None and s.monitor not in metrics and s.monitor.startswith("val_"):
        names.insert(0, s.monitor)
    return [(f"{name} (monitored)" if name == s.monitor else name, _num(metrics.get(name))) for name in names]


def _training_process(s: JobStatus) -> str:
    if s.pid is None or s.worker is None or s.state.value != "running":
        return "-"
    return f"pid {s.pid} on {s.worker.partition('@')[2] or s.worker}"


def details(s: JobStatus) -> str:
    rows = [
        ("id", s.id), ("name", s.name), ("state", s.state.value), ("queue", s.queue),
        ("attempt", f"{s.attempt} (lost {s.lost} of max {s.max_attempts})"), ("worker", s.worker or "-"),
        ("training process", _training_process(s)),
        ("epoch", _epoch(s)),
        ("step", f"{s.step}/{s.total_steps}" if s.total_steps else "-"),
        ("loss", _num(s.loss)), *_metric_rows(s),
        ("latest checkpoint", s.latest_checkpoint or "-"),
        ("best checkpoint", f"{s.best_checkpoint} ({s.monitor or 'monitored'} {_num(s.best_value)})"
         if s.best_checkpoint else "-"),
        ("resumed from step", "-" if s.resumed_from is None else str(s.resumed_from)),
        ("storage", s.storage_url or "-"), ("created", _when(s.created_at)), ("updated", _when(s.updated_at)),
    ]
    if s.waiting:
        rows.append(("waiting", s.waiting))
    if s.last_event and not s.state.terminal:
        rows.append(("last event", s.last_event))
    if s.error:
        rows.append(("error", s.error))
    width = max(18, *(len(k) for k, _ in rows))
    text = "\n".join(f"{k:>{width}}: {v}" for k, v in rows)
    if s.traceback:
        text += "\n\n" + s.traceback.rstrip()
    return text


def table(statuses: list[JobStatus]) -> str:
    header = f"{'ID':<40} {'STATE':<10} {'ATT':>3} {'STEP':>13} {'VAL_LOSS':>9} {'WORKER':<24}"
    lines = [header]
    for s in statuses:
        steps = f"{s.step}/{s.total_steps}" if s.total_steps else "-"
        lines.append(f"{s.id:<40} {s.state.value:<10} {s.attempt:>3} {steps:>13} {_num(s.val_loss):>9} {s.worker or '-':<24}")
    return "\n".join(lines)


def _value(value: object) -> str:
    return format(value, ".4g") if isinstance(value, float) else str(value)


def sweep_table(entries: list) -> str:
    """A sweep's jobs (``baton.jobs.sweeps.SweepEntry``, best first): the grid values that differ, the
    state and the best monitored value, with its direction."""
    if not entries:
        return "no jobs"
    axes = [p for p in entries[0].status.overrides or {}
            if len({repr((e.status.overrides or {}).get(p)) for e in entries}) > 1]
    monitor, mode = entries[0].monitor, entries[0].mode
    best = f"BEST {monitor} ({mode})"
    cells = [[e.status.id, e.status.state.value, *(_value((e.status.overrides or {}).get(p, "-")) for p in axes),
              f"{e.status.step}/{e.status.total_steps}" if e.status.total_steps else "-", _num(e.best_value)]
             for e in entries]
    header = ["ID", "STATE", *axes, "STEP", best]
    widths = [max(len(row[i]) for row in [header, *cells]) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *cells])


def _frames(exc: BaseException) -> list[tuple[str, traceback.FrameSummary]]:
    """(module name, frame) of each frame ``exc`` passed through, outermost first."""
    tbs = []
    tb = exc.__traceback__
    while tb is not None:
        tbs.append(tb)
        tb = tb.tb_next
    summaries = traceback.extract_tb(exc.__traceback__)
    return [(t.tb_frame.f_globals.get("__name__", ""), s) for t, s in zip(tbs, summaries)]


def _is_users(module: str, user_modules: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in user_modules)


LOADER_WORKER = re.compile(r"Caught (?P<type>\w+) in DataLoader worker process (?P<worker>\d+)\.\n"
                           r"Original Traceback \(most recent call last\):\n(?P<traceback>.*)", re.S)
"""How torch re-raises an exception of a DataLoader worker process: its traceback, as text."""
_FRAME = re.compile(r'^  File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<name>.*)$')


TRACEBACK_HEAD = "Traceback (most recent call last):"


def _failure_elsewhere(exc: BaseException, user_modules: tuple[str, ...]) -> Optional[list[str]]:
    """The lines of ``failure`` for an exception raised in another process, whose traceback came as
    text: torch's re-raise of a DataLoader worker's exception, or a data-parallel rank's failure
    (``UserCodeError.origin``). The original exception first, its notes, then the user's frames."""
    match = LOADER_WORKER.match(str(exc))
    if match is not None:
        return _from_text(match["traceback"], match["type"], f"in DataLoader worker process {match['worker']}",
                          exc, user_modules)
    if isinstance(exc, UserCodeError) and exc.origin and exc.traceback:
        last = exc.traceback.rsplit(TRACEBACK_HEAD + "\n", 1)[-1]  # the exception raised last, not its context
        return _from_text(last, type(exc).__name__, exc.origin, exc, user_modules)
    return None


def _from_text(traceback_text: str, type_name: str, where: str, exc: BaseException,
               user_modules: tuple[str, ...]) -> list[str]:
    text = traceback_text.rstrip("\n").splitlines()
    frames, i = [], 0
    while i < len(text) and (found := _FRAME.match(text[i])):
        i += 1
        code = text[i].strip() if i < len(text) and text[i].startswith("    ") else ""
        while i < len(text) and text[i].startswith("    "):  # the code line, and 3.11's carets under it
            i += 1
        frames.append((found["path"], found["line"], found["name"], code))
    cause, notes = (text[i], text[i + 1:]) if i < len(text) else (type_name, [])
    users_files = {getattr(m, "__file__", None) for name, m in list(sys.modules.items()) if _is_users(name, user_modules)}
    mine = [f for f in frames if f[0] in users_files]
    lines = [f"error: {cause} ({where})"]
    lines += [f"  {note.strip()}" for note in notes if note.strip()]
    lines += [f"  {note}" for note in getattr(exc, "__notes__", ())]
    if mine or frames:
        lines.append("Traceback (your code's frames, most recent call last):" if mine
                     else "Traceback (the innermost frame; none is in your code):")
        for path, line, name, code in mine or frames[-1:]:
            lines.append(f'  File "{path}", line {line}, in {name}')
            if code:
                lines.append(f"    {code}")
    return lines


def summary(exc: BaseException, user_modules: tuple[str, ...]) -> str:
    """A failure in one line, for a job's status: the cause and where it happened (``failure``'s head)."""
    from_worker = _failure_elsewhere(exc, user_modules)
    if from_worker is not None:
        head = list(itertools.takewhile(lambda line: not line.startswith("Traceback ("), from_worker))
    else:
        chain = exception_chain(exc)
        head = [f"error: {type(exc).__name__}: {exc}", *(f"  {n}" for e in chain for n in getattr(e, "__notes__", ()))]
    return "; ".join(line.strip() for line in head)[len("error: "):]


def failure(exc: BaseException, user_modules: tuple[str, ...], full_traceback_at: str) -> str:
    """A failed job for a terminal: the cause first, with where it happened (the exception's notes),
    then only the frames of the user's own code (modules under ``user_modules``; the innermost
    frame when none is), then where the whole traceback is kept. An exception re-raised from a
    DataLoader worker process, or raised on another rank, is shown as it was raised there."""
    from_worker = _failure_elsewhere(exc, user_modules)
    if from_worker is not None:
        return "\n".join([*from_worker, f"the whole traceback is in the job's log: {full_traceback_at}"])
    chain = exception_chain(exc)
    lines = [f"error: {type(exc).__name__}: {exc}"]
    for inner in chain[1:]:
        lines.append(f"  raised from {type(inner).__name__}: {inner}")
    for note in [n for e in chain for n in getattr(e, "__notes__", ())]:
        lines.append(f"  {note}")
    frames = [(m, f) for e in reversed(chain) for m, f in _frames(e)]
    mine = [f for m, f in frames if _is_users(m, user_modules)]
    if mine:
        lines.append("Traceback (your code's frames, most recent call last):")
    elif frames and not isinstance(chain[-1], BatonError):  # baton's own errors say all in their message
        mine = [frames[-1][1]]
        lines.append("Traceback (the innermost frame; none is in your code):")
    lines += [line.rstrip("\n") for line in traceback.format_list(mine)]
    lines.append(f"the whole traceback is in the job's log: {full_traceback_at}")
    return "\n".join(lines)
