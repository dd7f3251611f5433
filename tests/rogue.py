"""A job's own code that turns on the worker running it: models whose forward, at its Nth training call,
reach for what baton's source says the training process holds.

``tests.rogue:channel_writer`` writes into the channel its training process shares with the worker.
``what``: ``pickle`` (an object whose unpickling creates ``marker``: if that directory appears, the worker
ran the job's code) or ``forged`` (well-formed JSON whose progress report has fields of the wrong types).

``tests.rogue:store_prober`` takes every store object of its process and tries each call on another
job's objects (``victim``) and on the store's shared code; it writes what each try raised to ``report``
(JSON: call -> exception type, or "succeeded").

``tests.rogue:environment_reader`` looks for the pool's credentials (``secrets``: their values) in its
environment, in its own and its parent's ``/proc/<pid>/environ``, and in a process it starts; it writes
what it found to ``report``.

``tests.rogue:tenant_prober``, run as a user of its own (``BATON_JOB_USER``'s default), tries from its forward
and from a DataLoader worker (``pry``): the pool's variables; ``/proc/<pid>/environ`` and ``mem`` of every
baton process of another user; a SIGTERM to its forkserver and its worker; Redis without a password (and
with any it found); S3 with any credentials it found; another job's objects in the file store at
``store_root``; its shipped code's cache, the venv and baton's package; other jobs' ``/dev/shm``
directories. It writes each try's outcome to ``report_dir/report.json`` once (a resumed attempt does not).
"""
from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys

from torch import nn


class _MakesMarker:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (self.marker,)


class _AtForward(nn.Linear):
    """A linear model that ``act``s once, at its ``at_forward``-th training forward."""

    def __init__(self, at_forward: int):
        super().__init__(2, 3)
        self.at_forward, self.forwards = at_forward, 0

    def forward(self, x):
        if self.training:
            self.forwards += 1
            if self.forwards == self.at_forward:
                self.act()
        return super().forward(x)

    def act(self) -> None:
        raise NotImplementedError


class _ChannelWriter(_AtForward):
    def __init__(self, marker: str, at_forward: int, what: str):
        super().__init__(at_forward)
        self.marker, self.what = marker, what

    def act(self) -> None:
        conn = next(o.conn for o in gc.get_objects() if type(o).__name__ == "Remote")
        if self.what == "pickle":
            conn.send(("tell", 0, ("on_epoch", (_MakesMarker(self.marker),))))
        else:
            conn.send_bytes(b'["tell",0,"on_step",[{"epoch":"x","step":[]},1]]')


def channel_writer(marker: str, at_forward: int = 3, what: str = "pickle") -> nn.Module:
    return _ChannelWriter(marker, at_forward, what)


class _StoreProber(_AtForward):
    def __init__(self, report: str, victim: str, at_forward: int):
        super().__init__(at_forward)
        self.report, self.victim = report, victim

    def act(self) -> None:
        from baton.storage.stores.base import ObjectStore

        stores = [o for o in gc.get_objects() if isinstance(o, ObjectStore)]
        theirs = f"jobs/{self.victim}/"
        tries = {"read their manifest": lambda s: s.get_bytes(theirs + "manifest.json"),
                 "list every job": lambda s: s.list("jobs/"), "list theirs": lambda s: s.list(theirs),
                 "overwrite their manifest": lambda s: s.put_bytes(theirs + "manifest.json", b"{}"),
                 "delete their spec": lambda s: s.delete(theirs + "spec.json"),
                 "copy theirs out": lambda s: s.copy(theirs + "spec.json", f"jobs/{self.victim}-stolen/spec.json"),
                 "climb out with ..": lambda s: s.get_bytes(f"jobs/x/../{self.victim}/spec.json"),
                 "read shared code": lambda s: s.list("code/")}
        found = {"stores": sorted({type(s).__name__ for s in stores})}
        for store in stores:
            for name, call in tries.items():
                try:
                    call(store)
                    found[f"{type(store).__name__}: {name}"] = "succeeded"
                except Exception as exc:  # noqa: BLE001 - what each try raised is the report
                    found[f"{type(store).__name__}: {name}"] = type(exc).__name__
        with open(self.report, "w") as out:
            json.dump(found, out)


def store_prober(report: str, victim: str, at_forward: int = 3) -> nn.Module:
    return _StoreProber(report, victim, at_forward)


class _EnvironmentReader(_AtForward):
    def __init__(self, report: str, secrets: list[str]):
        super().__init__(3)
        self.report, self.secrets = report, secrets

    def act(self) -> None:
        def holding(text: str) -> list[str]:
            return [secret for secret in self.secrets if secret in text]

        def proc_environ(pid) -> str:
            with open(f"/proc/{pid}/environ", "rb") as raw:
                return raw.read().decode("latin-1")
        started = subprocess.run([sys.executable, "-c", "import sys; sys.stdout.write(open('/proc/self/environ', "
                                  "'rb').read().decode('latin-1'))"], capture_output=True, text=True, check=True).stdout
        found = {"names": sorted(n for n in os.environ if n.startswith(("AWS_", "BATON_REDIS", "BATON_STORAGE"))),
                 "os.environ": holding("\n".join(f"{k}={v}" for k, v in os.environ.items())),
                 "own /proc environ": holding(proc_environ("self")),
                 "parent's /proc environ": holding(proc_environ(os.getppid())),
                 "a process it started": holding(started)}
        with open(self.report, "w") as out:
            json.dump(found, out)


def environment_reader(report: str, secrets: list[str]) -> nn.Module:
    return _EnvironmentReader(report, secrets)


def _failed(call) -> str:
    """What ``call()`` raised (its type's name), or ``"succeeded"``."""
    try:
        call()
        return "succeeded"
    except Exception as exc:  # noqa: BLE001 - what each try raised is the report
        return type(exc).__name__


def _write(path: str) -> None:
    with open(path, "x") as out:
        out.write("a tenant was here")


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat_file:
        return int(stat_file.read().rsplit(")", 1)[1].split()[1])


def pry(redis_port: int, store_root: str, victim: str) -> dict:
    """Everything a job's process of its own user tries against its worker and the other jobs of the
    machine: each try's outcome (module doc of ``tenant_prober``)."""
    import sysconfig

    import redis

    import baton

    found: dict = {"uid": os.getuid(), "pid": os.getpid()}
    found["variables"] = sorted(n for n in os.environ if any(w in n for w in ("REDIS", "AWS", "BATON_STORAGE", "CELERY"))
                                and n != "AWS_EC2_METADATA_DISABLED")  # (set below, for boto3 not to wait on IMDS)
    others = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            owner = os.stat(f"/proc/{entry}").st_uid
            with open(f"/proc/{entry}/cmdline", "rb") as raw:  # (readable by everyone)
                command = raw.read().replace(b"\0", b" ").decode("latin-1")
        except OSError:
            continue
        if owner != os.getuid() and "baton" in command:
            others[entry] = [_failed(lambda: open(f"/proc/{entry}/environ", "rb").read()),
                             _failed(lambda: open(f"/proc/{entry}/mem", "rb").close())]
    found["baton processes"] = others
    forkserver = _parent(os.getpid())
    while os.stat(f"/proc/{forkserver}").st_uid == os.getuid():  # (from a loader worker: its training process)
        forkserver = _parent(forkserver)
    found["signal"] = {"forkserver": _failed(lambda: os.kill(forkserver, signal.SIGTERM)),
                       "worker": _failed(lambda: os.kill(_parent(forkserver), signal.SIGTERM))}
    found["redis without a password"] = _failed(lambda: redis.Redis(port=redis_port, socket_timeout=5).set("stolen", "1"))
    found["passwords found"] = [v for v in os.environ.values() if "redis://" in v or "rediss://" in v]
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    import boto3
    found["s3 with the credentials found"] = _failed(lambda: boto3.client("s3", region_name="us-east-1").list_buckets())
    theirs = os.path.join(store_root, "jobs", victim)
    found["file store"] = {"list the store": _failed(lambda: os.listdir(store_root)),
                           "list theirs": _failed(lambda: os.listdir(theirs)),
                           "read their manifest": _failed(lambda: open(os.path.join(theirs, "manifest.json")).read()),
                           "write theirs": _failed(lambda: _write(os.path.join(theirs, "planted")))}
    code = [p for p in sys.path if "baton-code-" in p]
    found["code cache"] = {"entries": len(code)}
    for entry in code:
        found["code cache"].update({"write its own entry": _failed(lambda: _write(os.path.join(entry, "planted.py"))),
                                    "change a file": _failed(lambda: open(os.path.join(entry, "shipped_note.py"), "a").close()),
                                    "list the cache": _failed(lambda: os.listdir(os.path.dirname(entry))),
                                    "write the cache": _failed(lambda: _write(os.path.join(os.path.dirname(entry), "x")))})
    found["venv"] = {"site-packages": _failed(lambda: _write(os.path.join(sysconfig.get_paths()["purelib"], "tenant.txt"))),
                     "baton": _failed(lambda: _write(os.path.join(os.path.dirname(baton.__file__), "tenant.txt")))}
    shm = {}
    for name in sorted(n for n in os.listdir("/dev/shm") if n.startswith("baton-")):
        path = os.path.join("/dev/shm", name)
        if os.stat(path).st_gid != os.getgid():  # (its own copies are lent to its group)
            shm[name] = [_failed(lambda: os.listdir(path)), _failed(lambda: _write(os.path.join(path, "planted")))]
    found["other jobs' /dev/shm"] = shm
    return found


class _PryingData:
    """A data set whose one item, loaded in a DataLoader worker process, is what ``pry`` found there."""

    def __init__(self, args: tuple):
        self.args = args

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> str:
        import torch.utils.data

        found = pry(*self.args)
        found["in a loader worker"] = torch.utils.data.get_worker_info() is not None
        return json.dumps(found)


class _TenantProber(_AtForward):
    def __init__(self, report_dir, redis_port: int, store_root: str, victim: str):
        super().__init__(3)
        self.report_dir, self.args = report_dir, (redis_port, store_root, victim)

    def act(self) -> None:
        import torch
        import torch.utils.data

        report = os.path.join(self.report_dir or "", "report.json")
        if self.report_dir is None or os.path.exists(report):  # (the reference run, a resumed attempt)
            return
        import random

        import numpy

        states = random.getstate(), numpy.random.get_state(), torch.get_rng_state()  # (the libraries it calls
        loader = torch.utils.data.DataLoader(_PryingData(self.args), batch_size=None, num_workers=1,  # draw from them:
                                             generator=torch.Generator().manual_seed(0))  # its training must not)
        found = {"forward": pry(*self.args), "loader worker": json.loads(next(iter(loader)))}
        random.setstate(states[0])
        numpy.random.set_state(states[1])
        torch.set_rng_state(states[2])
        with open(report + ".partial", "w") as out:
            json.dump(found, out)
        os.rename(report + ".partial", report)


def tenant_prober(report_dir=None, redis_port: int = 0, store_root: str = "", victim: str = "") -> nn.Module:
    return _TenantProber(report_dir, redis_port, store_root, victim)
