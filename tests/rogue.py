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
"""
from __future__ import annotations

import gc
import json
import os
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
