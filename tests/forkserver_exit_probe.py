"""Preloaded into a test's forkserver beside baton's own preload: marks what of the forkserver's exit ran.
An exit handler appends a line to ``$PROBE_DIR/atexit`` each time it is called; an object's ``__del__``
writes ``$PROBE_DIR/finalised`` when the interpreter tears this module down."""
import atexit
import os

_dir = os.environ["PROBE_DIR"]


def _mark(name: str) -> None:
    with open(os.path.join(_dir, name), "a") as f:
        f.write(f"{os.getpid()}\n")


atexit.register(_mark, "atexit")


class _Finalised:
    def __init__(self) -> None:
        self._fd = os.open(os.path.join(_dir, "finalised"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        self._write, self._close = os.write, os.close  # bound now: the os module may be gone by then

    def __del__(self) -> None:
        self._write(self._fd, b"finalised")
        self._close(self._fd)


_kept = _Finalised()

