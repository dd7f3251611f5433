"""G1 and G2 over s3:// (moto's server over HTTP, reached through a proxy that can fail):
killed mid-upload, a corrupt latest checkpoint, an endpoint that vanishes for seconds."""
from __future__ import annotations

import re
import time

import pytest

from baton.storage.open import open_store
from tests.helpers import (assert_same_training, baton_env, kill_when, make_spec, mid_epoch_after_two_checkpoints,
                           read_manifest, run_baton, run_reference, start_baton, write_spec)
from tests.netfault import FaultyProxy

# ~20 ms per optimizer step, so checkpoints (a few ms to upload) are taken as often as asked
SPEC = make_spec(data={"target": "tests.probes:slow_spiral", "kwargs": {"n_per_class": 200, "delay_s": 0.0003}},
                 loop={"epochs": 3, "grad_accum_steps": 2}, checkpoint={"every_steps": 2})


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """SPEC run uninterrupted, once for the module (in this process, file store): the runs compared
    with it are `baton run` processes over S3."""
    return run_reference(tmp_path_factory.mktemp("reference"), SPEC)


@pytest.fixture
def proxy(s3_server):
    p = FaultyProxy(s3_server.port)
    yield p
    p.close()


@pytest.fixture
def setup(tmp_path, s3_bucket, s3_env, proxy):
    """(spec path, storage URL, a store read directly, env for baton through the proxy)."""
    url = f"s3://{s3_bucket}/runs"
    env = baton_env(**{**s3_env, "AWS_ENDPOINT_URL": proxy.endpoint_url})
    return write_spec(tmp_path, SPEC), url, open_store(url), env


def freeze_when(proc, proxy, store, log, ready) -> dict:
    """Hold the job's storage requests until one is held while ``ready(its first line, the committed
    manifest)``: the job is then frozen (it cannot commit or finish) with that manifest, which is
    returned; the proxy is left holding."""
    deadline = time.monotonic() + 120
    while True:
        assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
        proxy.set("hold")  # the next request starts and cannot finish: commits are frozen
        while not proxy.held_starts:
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
            time.sleep(0.001)
        manifest = read_manifest(store, "cut")
        if manifest and ready(proxy.held_starts[0], manifest):
            return manifest
        proxy.set("pass")
        time.sleep(0.005)


def _resumed_from(stdout: str) -> tuple[int, int]:
    match = re.search(r"resuming \S+ from step (\d+) \(epoch \d+, batch (\d+)\)", stdout)
    assert match, stdout
    return int(match[1]), int(match[2])


def test_sigkill_mid_upload_and_mid_epoch_resumes_bit_exact(setup, reference, proxy, tmp_path):
    spec, url, store, env = setup

    proc = start_baton("run", str(spec), "--id", "cut", "--storage", url, env=env, log=tmp_path / "cut.log")
    ready = mid_epoch_after_two_checkpoints()
    committed = freeze_when(proc, proxy, store, tmp_path / "cut.log",  # a checkpoint upload in flight
                            lambda first, manifest: first.startswith(b"PUT ") and b"/checkpoints/step-" in first
                            and ready(manifest))
    kill_when(proc, store, "cut", lambda m: True)
    proxy.set("pass")
    assert committed["checkpoints"][-1]["kind"] == "step" and committed["checkpoints"][-1]["batch_in_epoch"] > 0
    assert read_manifest(store, "cut") == committed  # the held upload was never committed

    resumed = run_baton("run", str(spec), "--id", "cut", "--storage", url, env=env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert _resumed_from(resumed.stdout)[0] == committed["checkpoints"][-1]["step"]
    assert_same_training(reference, "reference", store, "cut")


def test_corrupt_latest_checkpoint_falls_back_and_stays_bit_exact(setup, reference, proxy, tmp_path):
    spec, url, store, env = setup
    proc = start_baton("run", str(spec), "--id", "cut", "--storage", url, env=env, log=tmp_path / "cut.log")

    def two_committed_mid_epoch(first: bytes, manifest: dict) -> bool:
        steps = [e for e in manifest["checkpoints"] if e["kind"] == "step"]
        # a latest checkpoint mid-epoch, of a job still running: one whose last commit is done may end
        # while a request of its own (its log's) is held, before it can be killed
        return (not manifest.get("completed") and len(steps) >= 2 and manifest["checkpoints"][-1]["kind"] == "step"
                and manifest["checkpoints"][-1]["batch_in_epoch"] > 0)

    # frozen first: unfrozen, a job this fast could finish between two looks at its manifest
    committed = freeze_when(proc, proxy, store, tmp_path / "cut.log", two_committed_mid_epoch)
    kill_when(proc, store, "cut", lambda m: True)
    proxy.set("pass")
    latest, previous = committed["checkpoints"][-1], committed["checkpoints"][-2]
    data = bytearray(store.get_bytes(latest["key"]))
    data[len(data) // 3] ^= 0x01  # one flipped bit
    store.put_bytes(latest["key"], bytes(data))

    resumed = run_baton("run", str(spec), "--id", "cut", "--storage", url, env=env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"step-{latest['step']}.pt: sha256 does not match" in resumed.stdout and "falling back" in resumed.stdout
    assert _resumed_from(resumed.stdout)[0] == previous["step"]
    assert_same_training(reference, "reference", store, "cut")


def test_endpoint_unreachable_for_seconds_mid_run(setup, reference, proxy, tmp_path):
    spec, url, store, env = setup
    proc = start_baton("run", str(spec), "--id", "flaky", "--storage", url, env=env, log=tmp_path / "flaky.log")
    deadline = time.monotonic() + 120
    while not (read_manifest(store, "flaky") or {}).get("checkpoints"):
        assert time.monotonic() < deadline and proc.poll() is None, (tmp_path / "flaky.log").read_text()
        time.sleep(0.005)
    proxy.set("cut")
    time.sleep(4)
    assert proc.poll() is None, "the job must keep going while storage is away"
    proxy.set("pass")
    assert proc.wait(timeout=180) == 0, (tmp_path / "flaky.log").read_text()

    log = (tmp_path / "flaky.log").read_text()
    assert "retrying" in log
    manifest = read_manifest(store, "flaky")
    keys = [e["key"] for e in manifest["checkpoints"]]
    assert manifest["completed"] and len(keys) == len(set(keys))  # nothing committed twice
    for entry in manifest["checkpoints"]:  # nothing committed is lost or torn
        assert store.size(entry["key"]) == entry["size"]
    assert_same_training(reference, "reference", store, "flaky")
