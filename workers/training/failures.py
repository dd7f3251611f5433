"""How a failure of the job's own code reads: one line for its status (``summary``), and for a terminal
the cause with where it happened and only the frames of the user's own code (``failure``). An
exception re-raised from a DataLoader worker process, or raised on another rank, is shown as it was
raised there. Used where the job's modules are loaded: the training process, and ``baton run``."""
from __future__ import annotations

import itertools
import re
import sys
import traceback
from typing import Optional

from baton.schemas.errors import BatonError, UserCodeError, exception_chain


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
