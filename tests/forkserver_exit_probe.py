"""Preloaded into a test's forkserver after baton's own preload: marks what of the forkserver's exit ran.
``$PROBE_DIR/atexit`` is written by an exit handler, ``$PROBE_DIR/finalised`` by an object's ``__del__``
when the interpreter tears this module down."""
import atexit
import os

_dir = os.environ["PROBE_DIR"]


def _mark(name: str) -> None:
    with open(os.path.join(_dir, name), "w") as f:
        f.write(str(os.getpid()))


atexit.register(_mark, "atexit")


class _Finalised:
    def __init__(self) -> None:
        self._fd = os.open(os.path.join(_dir, "finalised"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        self._write, self._close = os.write, os.close  # bound now: the os module may be gone by then

    def __del__(self) -> None:
        self._write(self._fd, b"finalised")
        self._close(self._fd)


_kept = _Finalised()

