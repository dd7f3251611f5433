"""Beside bench/chaos.py's job: a two-node job (2 workers, 1 sharded rank each) whose gang meets a Redis
restart the moment it is admitted, and whose every rendezvous meets a stranger who knows only its port
and keeps writing its own address into rank 1's place of the checkpoint group
(``tests/intruder.py steal-slot``). It must end bit-exact with the same two ranks on one node, and the
stranger must never get in (join a group, or have a rank unpickle what it sends)."""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis as redis_lib

from baton.storage.records import keys
from baton.storage.stores.file_store import FileStore

from tests.workers.parallel.test_fsdp import FSDP, assert_same_sharded_training

GANG_JOB = "chaos-gang"
GANG_SPEC = {**FSDP, "resources": {**FSDP["resources"], "processes": 1, "nodes": 2},
             "retry": {"max_attempts": 20}}
"""Two nodes of one rank: the same world as FSDP's two ranks on one node, so the same bits."""
NODES_ENV = {"BATON_GANG_DISTINCT": "worker", "BATON_NODE_ADDRESS": "127.0.0.1"}
"""Workers on one machine stand for nodes (distinct by name, loopback rendezvous)."""
STRANGER_WRITES_S = 10.0
ENDPOINT = re.compile(rf"job {GANG_JOB}: multi-node: .* rendezvous at (\S+:\d+)")


class GangSide:
    def __init__(self, h, repo: Path):
        self.h, self.repo = h, repo
        self.dir = Path(tempfile.mkdtemp(prefix="chaos-gang-", dir=h.workdir))
        self.marker = self.dir / "a-rank-ran-the-strangers-code"
        self.redis_restarted = False
        self.stranger_outcomes: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._strangers, name="chaos-stranger", daemon=True)

    def start(self) -> None:
        """Submit the job, restart Redis once its first gang is admitted, and set the stranger loose."""
        self.h.client.submit(GANG_SPEC, GANG_JOB)
        self._thread.start()
        direct = redis_lib.Redis.from_url(self.h.redis.url)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if direct.hget(keys.gang(GANG_JOB), "state") == b"admitted":
                self.h.redis.kill()
                time.sleep(1.5)
                self.h.redis.start()
                self.redis_restarted = True
                return
            time.sleep(0.002)

    def _strangers(self) -> None:
        """Every rendezvous the job's leaders announce, attacked once."""
        seen: set[str] = set()
        while not self._stop.wait(0.01):
            for log in self.h.workdir.glob("c*.log"):
                for endpoint in ENDPOINT.findall(log.read_text(errors="replace")):
                    if endpoint not in seen:
                        seen.add(endpoint)
                        self._attack(endpoint, len(seen))

    def _attack(self, endpoint: str, n: int) -> None:
        where = self.dir / f"stranger-{n}"
        where.mkdir()
        (where / "endpoint").write_text(endpoint)
        stranger = subprocess.Popen([sys.executable, "-m", "tests.intruder", "steal-slot", str(where),
                                     str(self.marker), str(STRANGER_WRITES_S)], cwd=self.repo, env=self.h.env,
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        threading.Thread(target=lambda: self.stranger_outcomes.append(
            f"{endpoint}: {(stranger.communicate()[0].strip().splitlines() or ['(nothing)'])[-1]}"), daemon=True).start()

    def result(self, reference: FileStore, final) -> dict:
        self._stop.set()
        time.sleep(STRANGER_WRITES_S + 1)  # the last stranger's outcome
        try:
            assert final is not None and final.state.value == "succeeded", final and final.error
            assert_same_sharded_training(reference, "gang-reference", self.h.store, GANG_JOB, self.dir)
            bit_exact, difference = True, None
        except AssertionError as exc:
            bit_exact, difference = False, str(exc)
        got_in = self.marker.exists() or any(": joined" in outcome for outcome in self.stranger_outcomes)
        return {"state": final.state.value if final else "timeout", "attempts": final and final.attempt,
                "lost": final and final.lost, "bit_exact": bit_exact, "difference": difference,
                "redis_restarted_at_admission": self.redis_restarted, "strangers": self.stranger_outcomes,
                "stranger_got_in": got_in, "as_expected": bit_exact and not got_in and self.redis_restarted}
