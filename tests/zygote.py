"""`baton` commands for the tests, forked from a warm process instead of started as new interpreters.

A `baton run` started as ``python -m baton`` spends ~3.5 s of a core importing torch, torch._dynamo (its
first optimizer imports it), torchmetrics, matplotlib and scipy before it trains a step, and the suite
starts one ~170 times; a CLI command spends ~0.5 s. This module's server (``python -m tests.zygote``, one
per pytest process, started at its first use) imports those third-party libraries once, never baton's
own code, starts no thread, and forks a child per command. The child is what a new interpreter running
``python -m baton ARGS`` would be: its own pid (in a session of its own where asked), the test's
environment, working directory and standard streams, ``sys.argv``, baton imported fresh under that
environment, ``atexit`` handlers run at exit; it is signalled and killed by pid or process group as any
process is. It differs in what cannot matter to a test of baton: the libraries were imported under the
server's environment (a command whose interpreter-level variables differ, ``PYTHON*``, thread counts,
library paths, falls back to a new interpreter), its hash seed is the server's, and
``/proc/PID/cmdline`` and ``/proc/PID/environ`` are the server's (a test that reads them starts its
command with ``fresh=True``). tests/jobs/test_cli_run.py runs ``python -m baton`` itself.

The server is the child's parent: it reaps it and reports its exit status over the socket it was started
with, which ``Forked`` (as much of ``subprocess.Popen`` as the tests use) reads. It ends with the pytest
process (PR_SET_PDEATHSIG, and at the end of its socket).
"""
from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Optional

PRELOAD = ("torch", "torch._dynamo", "torchmetrics", "matplotlib.pyplot", "numpy", "pydantic", "pydantic_settings",
           "yaml", "typer", "click", "tqdm", "safetensors.torch", "torchdata.stateful_dataloader", "boto3",
           "botocore.session", "redis", "celery", "kombu", "cryptography.hazmat.primitives.ciphers.aead",
           "prometheus_client", "pathspec", "packaging.requirements", "torch.utils.tensorboard", "torch.distributed")
"""Imported by the server: third-party only, so that baton's own modules read the command's environment."""

INTERPRETER_LEVEL = ("PYTHON", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "GOMP_", "TORCH", "PYTORCH", "CUDA", "CUBLAS",
                     "NCCL", "LD_", "MALLOC", "MPLBACKEND", "MPLCONFIGDIR", "TF_", "HOME", "TMPDIR")
"""Variables read as an interpreter or a library starts: a command whose values differ from the server's
starts as a new interpreter."""

SET_BY_TORCH = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
"""Set by torch in its own process once it has compiled or traced (its default cache directories): the
tests' environment gains them after a job trains in the pytest process; they are not the test's choice."""

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
    if threading.active_count() != 1:
        control.send(json.dumps({"ready": False, "why": "a preloaded library started a thread"}).encode())
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
            request = json.loads(message)
            sys.stdout.flush()
            sys.stderr.flush()
            set_up_r, set_up_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                control.close()
                os.close(wake_r)
                os.close(wake_w)
                os.close(set_up_r)
                _child(request, fds, set_up_w)  # never returns
            os.close(set_up_w)
            for received in fds:
                os.close(received)
            os.read(set_up_r, 1)  # its end closed: in its session, with its streams (as Popen returns after exec)
            os.close(set_up_r)
            control.send(json.dumps({"pid": pid}).encode())
            _reap(control)


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
    """What ``python -m baton ARGS`` does, in this forked process; exits with its status."""
    import atexit
    import io
    import runpy

    code = 1
    try:
        signal.set_wakeup_fd(-1)
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
        os.close(set_up)  # the server may say it started
        unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
        sys.stdin = io.TextIOWrapper(io.open(0, "rb", closefd=False, buffering=0 if unbuffered else -1))
        out = io.open(1, "wb", closefd=False)
        sys.stdout = io.TextIOWrapper(out, line_buffering=out.isatty(), write_through=unbuffered)
        sys.stderr = io.TextIOWrapper(io.open(2, "wb", closefd=False), errors="backslashreplace",
                                      line_buffering=True, write_through=unbuffered)
        from multiprocessing import process

        process._current_process = type(process._current_process)()  # type: ignore[attr-defined]  (its own authkey)
        sys.argv = [os.path.join(request["repo"], "baton", "__main__.py"), *request["args"]]
        sys.path[0] = os.getcwd()  # as `python -m` sets it
        try:
            runpy.run_module("baton", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc.code)
        except KeyboardInterrupt:  # a new interpreter dies of the SIGINT it did not handle
            _finish(atexit)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        except BaseException:  # noqa: BLE001 - as a new interpreter: the traceback on stderr, exit 1
            import traceback

            traceback.print_exc()
            code = 1
        _finish(atexit)
    except BaseException:  # noqa: BLE001 - the set-up above failed: said where the command's stderr goes
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _exit_code(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def _finish(atexit) -> None:
    """An interpreter's shutdown: its non-daemon threads joined, its exit handlers run, its streams flushed."""
    try:
        threading._shutdown()  # type: ignore[attr-defined]
    except BaseException:  # noqa: BLE001
        pass
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


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
        if self.poll() is None:  # not reaped: the pid is still this command's
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __enter__(self) -> "Forked":
        return self

    def __exit__(self, *_) -> None:
        self.wait()


class Zygote:
    """This pytest process's server, started at its first use; None where it could not start."""

    def __init__(self, env: dict[str, str], repo: str):
        self.env, self.repo = env, repo
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._proc = subprocess.Popen([sys.executable, "-m", "tests.zygote", str(theirs.fileno()), str(os.getpid())],
                                      env=env, cwd=repo, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        theirs.close()
        self._control = ours
        self._lock = threading.Lock()  # one request at a time
        self._exits: dict[int, int] = {}
        self._replies: list[dict] = []
        self._changed = threading.Condition()
        hello = json.loads(ours.recv(BUFFER) or b'{"ready": false}')
        self.ready = bool(hello.get("ready"))
        if self.ready:
            threading.Thread(target=self._read, name="zygote-reader", daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                message = self._control.recv(BUFFER)
            except OSError:
                message = b""
            with self._changed:
                if not message:
                    self.ready = False
                    self._changed.notify_all()
                    return
                reply = json.loads(message)
                if "exit" in reply:
                    self._exits[reply["exit"]] = reply["code"]
                else:
                    self._replies.append(reply)
                self._changed.notify_all()

    def accepts(self, env: dict[str, str]) -> bool:
        """Whether a command with ``env`` may be forked here: its interpreter-level variables are the server's."""
        def level(values: dict[str, str]) -> dict[str, str]:
            return {k: v for k, v in values.items() if k.startswith(INTERPRETER_LEVEL) and k not in SET_BY_TORCH}
        return self.ready and level(env) == level(self.env)

    def serves(self, args: list[str], env: dict[str, str]) -> bool:
        """Whether the command ``args`` with ``env`` may be forked here."""
        command = next((arg for arg in args if not arg.startswith("-")), None)
        return command not in FRESH_COMMANDS and self.accepts(env)

    def start(self, args: list[str], env: dict[str, str], cwd: str, stdin: int, stdout: int, stderr: int,
              new_session: bool) -> Forked:
        request = json.dumps({"args": args, "env": env, "cwd": cwd, "repo": self.repo, "new_session": new_session})
        with self._lock:
            socket.send_fds(self._control, [request.encode()], [stdin, stdout, stderr])
            with self._changed:
                if not self._changed.wait_for(lambda: self._replies or not self.ready, 60) or not self._replies:
                    raise RuntimeError("the tests' zygote did not fork the command")
                pid = self._replies.pop(0)["pid"]
        return Forked(self, pid, args)

    def exit_code(self, pid: int, timeout: Optional[float]) -> Optional[int]:
        with self._changed:
            self._changed.wait_for(lambda: pid in self._exits or not self.ready, timeout)
            if pid not in self._exits and not self.ready:
                raise RuntimeError(f"the tests' zygote ended before command {pid} did")
            return self._exits.get(pid)


_zygote: Optional[Zygote] = None
_zygote_lock = threading.Lock()
_starts = 0


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVER_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
"""The server's environment: this process's as the tests' helpers were imported (what ``baton_env`` gives)."""


def zygote() -> Optional[Zygote]:
    """This process's server (started at the first call), or None where it cannot serve; set
    ``BATON_TESTS_FRESH_INTERPRETERS=1`` to start every command as a new interpreter."""
    global _zygote, _starts
    if os.environ.get("BATON_TESTS_FRESH_INTERPRETERS"):
        return None
    with _zygote_lock:
        # started from the main thread only: PR_SET_PDEATHSIG follows the thread that started it, so one
        # started from a test's thread would be killed when that thread ends
        if (_zygote is None or not _zygote.ready) and _starts < 3 and threading.current_thread() is threading.main_thread():
            _starts += 1
            _zygote = Zygote(SERVER_ENV, REPO)
        return _zygote if _zygote is not None and _zygote.ready else None


def run(args: list[str], env: dict[str, str], cwd: str, timeout: float) -> Optional[subprocess.CompletedProcess]:
    """``subprocess.run([python, -m, baton, *args], capture_output=True, text=True)`` through the server;
    None where it cannot serve this command (then start a new interpreter)."""
    import tempfile

    server = zygote()
    if server is None or not server.serves(args, env):
        return None
    with open(os.devnull, "rb") as stdin, tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = server.start(args, env, cwd, stdin.fileno(), out.fileno(), err.fileno(), new_session=False)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        return subprocess.CompletedProcess(args, proc.returncode, _text(out), _text(err))


def start(args: list[str], env: dict[str, str], cwd: str, log: Optional[IO], capture: bool = False) -> Optional[Forked]:
    """``subprocess.Popen([python, -m, baton, *args], stdout=log, stderr=STDOUT, start_new_session=True)``
    through the server (``capture``: ``stdout=PIPE, stderr=PIPE, text=True`` instead); None where it cannot
    serve this command."""
    server = zygote()
    if server is None or not server.serves(args, env):
        return None
    with open(os.devnull, "rb") as stdin, open(os.devnull, "wb") as null:
        if not capture:
            out = log.fileno() if log is not None else null.fileno()
            return server.start(args, env, cwd, stdin.fileno(), out, out, new_session=True)
        (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
        try:
            proc = server.start(args, env, cwd, stdin.fileno(), out_w, err_w, new_session=True)
        except BaseException:
            os.close(out_r)
            os.close(err_r)
            raise
        finally:
            os.close(out_w)
            os.close(err_w)
        proc.stdout, proc.stderr = open(out_r, errors="replace"), open(err_r, errors="replace")
        return proc


def _text(file: IO[bytes]) -> str:
    file.seek(0)
    return file.read().decode(errors="replace")


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]))
