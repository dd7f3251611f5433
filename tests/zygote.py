"""`baton` commands for the tests, forked from a warm process instead of started as new interpreters.

A `baton run` started as ``python -m baton`` spends ~4 s of a core importing torch, torch._dynamo (its
first optimizer imports it), torchmetrics, matplotlib and scipy before it trains a step, and the suite
starts one ~170 times; a CLI command spends ~0.5 s. This module's server (``python -m tests.zygote``, one
per pytest process, started at its first use from the main thread) imports those third-party libraries
once, never baton's own code, starts no thread, and forks a child per command. The child is what a new
interpreter running ``python -m baton ARGS`` would be: its own pid (in a session of its own where asked),
the test's environment, working directory and standard streams (buffered as CPython buffers them),
``sys.argv`` and ``sys.path``, baton imported fresh under that environment, and it leaves as such an
interpreter leaves (its status, excepthook, exit handlers, flushed streams, death by an unhandled
SIGINT; the modules' finalisation skipped); it is signalled and killed by pid or process group as any
process is. It differs where a test of baton does not look: the libraries were imported under the
server's environment (a command whose interpreter-level variables differ, ``PYTHON*``, thread counts,
library paths, starts as a new interpreter), every child has the server's hash seed, and
``/proc/PID/cmdline`` and ``/proc/PID/environ`` are the server's (a test that reads them, or checks what a
new interpreter does, passes ``fresh=True``).

The server is the child's parent: it reaps it and reports its exit status over the socket it was started
with, which ``Forked`` (as much of ``subprocess.Popen`` as the tests use) reads. It ends with the pytest
process (PR_SET_PDEATHSIG, and at the end of its socket); what it says itself goes to ``Zygote.log``.
"""
from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Optional

PRELOAD = ("torch", "torch._dynamo", "torchmetrics", "matplotlib.figure", "numpy", "pydantic", "pydantic_settings",
           "yaml", "typer", "click", "tqdm", "safetensors.torch", "torchdata.stateful_dataloader", "boto3",
           "botocore.session", "redis", "celery", "kombu", "cryptography.hazmat.primitives.ciphers.aead",
           "prometheus_client", "pathspec", "packaging.requirements", "torch.utils.tensorboard", "torch.distributed")
"""Imported by the server: third-party only, so that baton's own modules read the command's environment."""

INTERPRETER_LEVEL = ("PYTHON", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "GOMP_", "TORCH", "PYTORCH", "CUDA", "CUBLAS",
                     "NCCL", "LD_", "MALLOC", "MPLBACKEND", "MPLCONFIGDIR", "TF_", "HOME", "TMPDIR")
"""Variables read as an interpreter or a library starts: a command whose values differ from the server's
starts as a new interpreter."""

SET_BY_LIBRARIES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "CUDA_MODULE_LOADING", "KMP_DUPLICATE_LIB_OK",
                    "KMP_INIT_AT_FORK")
"""Set in the pytest process by the libraries themselves, not by a test: torch's cache directories once it
has traced, its CUDA loading once CUDA started, scikit-learn's OpenMP settings once it loaded a data set."""

FRESH_COMMANDS = ("worker", "ui", "demo")
"""Commands that always start as new interpreters: a worker's main process must not hold torch (its
imports are what tests/test_layout.py checks), and the dashboard and the demo run as they are shipped."""

BUFFER = 1 << 20


# ---- the server --------------------------------------------------------------------------------------

def _serve(fd: int, parent: int) -> None:
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(0)
    os.setsid()  # a child's killpg never reaches the pytest process's group
    control = socket.socket(fileno=fd)
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass
    why = _unforkable()
    if why:
        control.send(json.dumps({"ready": False, "why": why}).encode())
        return
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    control.send(json.dumps({"ready": True, "pid": os.getpid()}).encode())
    while True:
        readable, _, _ = select.select([control, wake_r], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
            _reap(control)
        if control in readable:
            message, fds, _, _ = socket.recv_fds(control, BUFFER, 3)
            if not message:
                return  # the pytest process is gone
            try:
                pid = _fork(json.loads(message), fds, control, (wake_r, wake_w))
            except OSError as exc:  # (the kernel refused the fork): the tests start a new interpreter
                control.send(json.dumps({"error": str(exc)}).encode())
            else:
                control.send(json.dumps({"pid": pid}).encode())
            _reap(control)


def _unforkable() -> str:
    """Why this server may not fork commands ("" if it may): a fork copies only the forking thread."""
    import torch

    # (native threads, such as the one importing torch starts, are the libraries' to survive a fork, as they
    # do in a worker's forkserver: what baton itself checks before it forks, storage/forked.may_fork)
    if threading.active_count() != 1:
        return "a preloaded library started a thread"
    if torch.cuda.is_initialized():
        return "a preloaded library initialised CUDA"
    return ""


def _fork(request: dict, fds: list[int], control: socket.socket, wake: tuple[int, int]) -> int:
    """Fork the command; its pid once it is set up (in its session, with its streams), as Popen returns
    once the new program runs."""
    sys.stdout.flush()
    sys.stderr.flush()
    set_up_r, set_up_w = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(set_up_r)
        os.close(set_up_w)
        raise
    if pid == 0:
        signal.set_wakeup_fd(-1)
        control.close()
        for end in (*wake, set_up_r):
            os.close(end)
        _child(request, fds, set_up_w)  # leaves only by SystemExit or os._exit
    os.close(set_up_w)
    for received in fds:
        os.close(received)
    os.read(set_up_r, 1)  # EOF: the child closed its end
    os.close(set_up_r)
    return pid


def _reap(control: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        control.send(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}).encode())


def _child(request: dict, fds: list[int], set_up: int) -> None:
    """What ``python -m baton ARGS`` does, in this forked process, and its exit as CPython's: the exception
    it did not catch through ``sys.excepthook`` (typer's), the non-daemon threads joined, the exit handlers
    run, the streams flushed, death by an unhandled SIGINT."""
    import io
    import runpy

    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        if request["new_session"]:
            os.setsid()
        for target, fd in zip((0, 1, 2), fds):
            os.dup2(fd, target)
        for fd in set(fds) - {0, 1, 2}:
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        # the standard streams as CPython makes them: stdin buffered; stdout line-buffered on a terminal, stderr
        # always; with PYTHONUNBUFFERED (-u) both unbuffered and written through
        unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
        sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.open(0, "rb", closefd=False), encoding=sys.stdin.encoding)
        streams = []
        for fd, errors in ((1, "strict"), (2, "backslashreplace")):
            raw = io.open(fd, "wb", buffering=0 if unbuffered else -1, closefd=False)
            streams.append(io.TextIOWrapper(raw, encoding=sys.stdout.encoding, errors=errors, write_through=unbuffered,
                                            line_buffering=not unbuffered and (fd == 2 or raw.isatty())))
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__ = streams
        from multiprocessing import process

        process._current_process = type(process._current_process)()  # type: ignore[attr-defined]  (its own authkey)
        sys.argv = [os.path.join(request["repo"], "baton", "__main__.py"), *request["args"]]
        sys.path[0] = os.getcwd()  # as `python -m` sets it
        os.close(set_up)  # the server may say it started
    except BaseException:  # noqa: BLE001 - the set-up failed: said on the command's stderr
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    code, interrupted = 0, False
    try:
        runpy.run_module("baton", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException as exc:  # noqa: BLE001 - as CPython: the excepthook (typer's) says it, exit 1 or SIGINT
        sys.excepthook(type(exc), exc, exc.__traceback__)
        code, interrupted = 1, isinstance(exc, KeyboardInterrupt)
    # CPython's shutdown up to its modules' finalisation, which is skipped: tearing torch, scipy and matplotlib
    # down costs ~2 s of a core, which a command that never imported them (`baton status`) does not pay
    try:
        threading._shutdown()  # type: ignore[attr-defined]  (the non-daemon threads joined)
    except BaseException:  # noqa: BLE001
        pass
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if interrupted:  # dies of the SIGINT it did not handle
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _exit_code(value: object) -> int:
    """The status ``SystemExit(value)`` ends an interpreter with."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


# ---- the tests' side ---------------------------------------------------------------------------------

class Forked:
    """A command forked by the server: ``pid``, ``returncode``, ``poll``, ``wait`` (a timeout raises
    ``subprocess.TimeoutExpired``), ``send_signal``, ``terminate``, ``kill``, as ``subprocess.Popen``."""

    def __init__(self, zygote: "Zygote", pid: int, args: list[str], stdout: Optional[IO[str]] = None,
                 stderr: Optional[IO[str]] = None):
        self._zygote, self.pid, self.args = zygote, pid, args
        self.stdout, self.stderr = stdout, stderr  # text pipes, where its output was asked for
        self.returncode: Optional[int] = None

    def communicate(self, timeout: Optional[float] = None) -> tuple[str, str]:
        """Its whole output (until every holder of its pipes has closed them) and then its exit, as
        ``Popen.communicate``."""
        import selectors

        deadline = None if timeout is None else time.monotonic() + timeout
        chunks: dict[int, list[bytes]] = {}
        with selectors.DefaultSelector() as selector:
            for stream in (self.stdout, self.stderr):
                if stream is not None and not stream.closed:
                    chunks[stream.fileno()] = []
                    selector.register(stream.fileno(), selectors.EVENT_READ)
            while selector.get_map():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout or 0)
                for key, _ in selector.select(left):
                    data = os.read(key.fd, 65536)
                    if data:
                        chunks[key.fd].append(data)
                    else:
                        selector.unregister(key.fd)
        texts = []
        for stream in (self.stdout, self.stderr):
            texts.append(b"".join(chunks.get(stream.fileno(), [])).decode(errors="replace") if stream is not None else "")
            if stream is not None:
                stream.close()
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return texts[0], texts[1]

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            self.returncode = self._zygote.exit_code(self.pid, 0)
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        if self.returncode is None:
            self.returncode = self._zygote.exit_code(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        try:
            running = self.poll() is None  # not reaped: the pid is still this command's
        except RuntimeError:  # the server is gone, and with it what the pid's end was: signal it all the same
            running = True
        if running:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """This pytest process's server; ``ready`` while it serves."""

    def __init__(self, env: dict[str, str], repo: str):
        import tempfile

        self.env, self.repo, self.owner = env, repo, os.getpid()
        folder = tempfile.mkdtemp(prefix="baton-test-zygote-")
        atexit.register(shutil.rmtree, folder, True)
        self.log = os.path.join(folder, "server.log")  # what the server itself says (a traceback, if it fails)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with open(self.log, "wb") as log:
            self._proc = subprocess.Popen([sys.executable, "-m", "tests.zygote", str(theirs.fileno()), str(os.getpid())],
                                          env=env, cwd=repo, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                          stdout=log, stderr=subprocess.STDOUT)
        theirs.close()
        self._control = ours
        self._lock = threading.Lock()  # one request at a time
        self._exits: dict[int, int] = {}
        self._replies: list[dict] = []
        self._changed = threading.Condition()
        hello = json.loads(ours.recv(BUFFER) or b'{"ready": false, "why": "it ended"}')
        self.ready, self.why = bool(hello.get("ready")), hello.get("why", "")
        if self.ready:
            threading.Thread(target=self._read, name="zygote-reader", daemon=True).start()

    def _read(self) -> None:
        try:
            while message := self._control.recv(BUFFER):
                with self._changed:
                    reply = json.loads(message)
                    if "exit" in reply:
                        self._exits[reply["exit"]] = reply["code"]
                    else:
                        # a new command's pid: the server reported the exit of any earlier command that had it
                        # before it forked this one, and that exit is not this command's
                        self._exits.pop(reply.get("pid", -1), None)
                        self._replies.append(reply)
                    self._changed.notify_all()
        except (OSError, ValueError):
            pass
        finally:
            with self._changed:
                self.ready = False
                self._changed.notify_all()

    def accepts(self, env: dict[str, str]) -> bool:
        """Whether a command with ``env`` may be forked here: its interpreter-level variables are the server's."""
        def level(values: dict[str, str]) -> dict[str, str]:
            return {k: v for k, v in values.items() if k.startswith(INTERPRETER_LEVEL) and k not in SET_BY_LIBRARIES}
        return self.ready and level(env) == level(self.env)

    def serves(self, args: list[str], env: dict[str, str]) -> bool:
        """Whether the command ``args`` with ``env`` may be forked here."""
        command = next((arg for arg in args if not arg.startswith("-")), None)
        return command not in FRESH_COMMANDS and self.accepts(env)

    def start(self, args: list[str], env: dict[str, str], cwd: str, stdin: int, stdout: int, stderr: int,
              new_session: bool) -> Optional[Forked]:
        """The command forked, or None where the server refused it (a fork the kernel refused)."""
        request = json.dumps({"args": args, "env": env, "cwd": cwd, "repo": self.repo, "new_session": new_session})
        with self._lock:
            try:
                socket.send_fds(self._control, [request.encode()], [stdin, stdout, stderr])
                with self._changed:
                    if not self._changed.wait_for(lambda: self._replies or not self.ready, 60) or not self._replies:
                        raise RuntimeError(f"the tests' zygote did not fork the command (its log: {self.log})")
                    reply = self._replies.pop(0)
            except BaseException:
                self.close()  # a reply that comes late would be taken for the next command's
                raise
        return Forked(self, reply["pid"], args) if "pid" in reply else None

    def exit_code(self, pid: int, timeout: Optional[float]) -> Optional[int]:
        with self._changed:
            self._changed.wait_for(lambda: pid in self._exits or not self.ready, timeout)
            if pid not in self._exits and not self.ready:
                raise RuntimeError(f"the tests' zygote ended before command {pid} did (its log: {self.log})")
            return self._exits.pop(pid, None)

    def close(self) -> None:
        with self._changed:
            self.ready = False
            self._changed.notify_all()
        try:
            self._control.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


_zygote: Optional[Zygote] = None
_zygote_lock = threading.Lock()
_starts = 0


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVER_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
"""The server's environment: this process's as the tests' helpers were imported (what ``baton_env`` gives)."""


def zygote() -> Optional[Zygote]:
    """This process's server (started at the first call), or None where it cannot serve; set
    ``BATONTEST_FRESH_INTERPRETERS=1`` to start every command as a new interpreter."""
    global _zygote, _starts
    if os.environ.get("BATONTEST_FRESH_INTERPRETERS"):
        return None
    with _zygote_lock:
        if _zygote is not None and _zygote.owner != os.getpid():
            return None  # a fork of the pytest process: the server's socket is its parent's
        # started from the main thread only: PR_SET_PDEATHSIG follows the thread that started it, so one
        # started from a test's thread would be killed when that thread ends
        if (_zygote is None or not _zygote.ready) and _starts < 3 and threading.current_thread() is threading.main_thread():
            _starts += 1
            _zygote = Zygote(SERVER_ENV, REPO)
        return _zygote if _zygote is not None and _zygote.ready else None


def run(args: list[str], env: dict[str, str], cwd: str, timeout: float) -> Optional[subprocess.CompletedProcess]:
    """``subprocess.run([python, -m, baton, *args], capture_output=True, text=True, timeout=timeout)`` through
    the server: its output read to the end of its pipes (every holder closed them), then its exit. None where
    it cannot serve this command (then start a new interpreter)."""
    proc = _start(args, env, cwd, None, capture=True, new_session=False)
    if proc is None:
        return None
    try:
        out, err = proc.communicate(timeout)
    except BaseException:  # a timeout, the test's own timeout, an interrupt: the command does not outlive it
        proc.kill()
        proc.wait()
        raise
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def start(args: list[str], env: dict[str, str], cwd: str, log: Optional[IO], capture: bool = False) -> Optional[Forked]:
    """``subprocess.Popen([python, -m, baton, *args], stdout=log, stderr=STDOUT, start_new_session=True)``
    through the server (``capture``: ``stdout=PIPE, stderr=PIPE, text=True`` instead); None where it cannot
    serve this command."""
    return _start(args, env, cwd, log, capture, new_session=True)


def _start(args: list[str], env: dict[str, str], cwd: str, log: Optional[IO], capture: bool,
           new_session: bool) -> Optional[Forked]:
    server = zygote()
    if server is None or not server.serves(args, env):
        return None
    with open(os.devnull, "rb") as stdin, open(os.devnull, "wb") as null:
        if not capture:
            out = log.fileno() if log is not None else null.fileno()
            return server.start(args, env, cwd, stdin.fileno(), out, out, new_session)
        (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
        try:
            proc = server.start(args, env, cwd, stdin.fileno(), out_w, err_w, new_session)
        except BaseException:
            proc = None
            raise
        finally:
            os.close(out_w)
            os.close(err_w)
            if proc is None:
                os.close(out_r)
                os.close(err_r)
        if proc is None:
            return None
        proc.stdout, proc.stderr = open(out_r, errors="replace"), open(err_r, errors="replace")
        return proc


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]))
