"""A job's own code that turns on the worker running it: a model whose forward, at its Nth training call,
writes into the channel its training process shares with the worker (baton's source says where it is).

Specs name it ``tests.rogue:channel_writer``. ``what``: ``pickle`` (an object whose unpickling creates
``marker``: if that directory appears, the worker ran the job's code) or ``forged`` (well-formed JSON
whose progress report has fields of the wrong types).
"""
from __future__ import annotations

import gc
import os

from torch import nn


class _MakesMarker:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (self.marker,)


class _ChannelWriter(nn.Linear):
    def __init__(self, marker: str, at_forward: int, what: str):
        super().__init__(2, 3)
        self.marker, self.at_forward, self.what, self.forwards = marker, at_forward, what, 0

    def forward(self, x):
        if self.training:
            self.forwards += 1
            if self.forwards == self.at_forward:
                conn = next(o.conn for o in gc.get_objects() if type(o).__name__ == "Remote")
                if self.what == "pickle":
                    conn.send(("tell", 0, ("on_epoch", (_MakesMarker(self.marker),))))
                else:
                    conn.send_bytes(b'["tell",0,"on_step",[{"epoch":"x","step":[]},1]]')
        return super().forward(x)


def channel_writer(marker: str, at_forward: int = 3, what: str = "pickle") -> nn.Module:
    return _ChannelWriter(marker, at_forward, what)
