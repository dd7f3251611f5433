"""G1 and G2 over s3:// (moto's server over HTTP): killed mid-upload and a corrupt latest checkpoint
(reached through tests/s3_gateway.py, which holds the job at the moment it is killed), an endpoint
that vanishes for seconds (reached through a proxy that can fail)."""
from __future__ import annotations

import re
import time

import pytest

from baton.storage.stores.open import open_store
from tests.helpers import (assert_same_training, baton_env, kill_frozen, make_spec,
                           read_manifest, run_baton, run_reference, start_baton, write_spec)
from tests.netfault import FaultyProxy
from tests.s3_gateway import S3Gateway

# ~20 ms per optimizer step; an upload and commit through the gateway takes several steps, so periodic
# checkpoints are skipped while one is in flight: only the first (step 2) is sure to be taken
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
def gateway(s3_server):
    gw = S3Gateway(s3_server.port)
    yield gw
    gw.close()


def _setup(tmp_path, s3_bucket, s3_env, endpoint_url):
    """(spec path, storage URL, a store read directly, env for baton through ``endpoint_url``)."""
    url = f"s3://{s3_bucket}/runs"
    env = baton_env(**{**s3_env, "AWS_ENDPOINT_URL": endpoint_url})
    return write_spec(tmp_path, SPEC), url, open_store(url), env


@pytest.fixture
def setup(tmp_path, s3_bucket, s3_env, proxy):
    """baton through the proxy that can fail."""
    return _setup(tmp_path, s3_bucket, s3_env, proxy.endpoint_url)


@pytest.fixture
def held_setup(tmp_path, s3_bucket, s3_env, gateway):
    """baton through the gateway that can hold its requests."""
    return _setup(tmp_path, s3_bucket, s3_env, gateway.endpoint_url)


def _resumed_from(stdout: str) -> tuple[int, int]:
    match = re.search(r"resuming \S+ from step (\d+) \(epoch \d+, batch (\d+)\)", stdout)
    assert match, stdout
    return int(match[1]), int(match[2])


def _latest_mid_epoch(manifest: dict) -> bool:
    return bool(manifest["checkpoints"]) and manifest["checkpoints"][-1]["kind"] == "step" \
        and manifest["checkpoints"][-1]["batch_in_epoch"] > 0


@pytest.mark.slow
def test_sigkill_mid_upload_and_mid_epoch_resumes_bit_exact(held_setup, reference, gateway, tmp_path):
    spec, url, store, env = held_setup

    proc = start_baton("run", str(spec), "--id", "cut", "--storage", url, env=env, log=tmp_path / "cut.log")
    # held at a checkpoint's upload (in flight: sent, never answered) once the committed manifest is ready
    committed = kill_frozen(proc, gateway, store, "cut", _latest_mid_epoch, log=tmp_path / "cut.log",
                            at=lambda method, path: method == "PUT" and "/checkpoints/step-" in path)
    assert committed["checkpoints"][-1]["kind"] == "step" and committed["checkpoints"][-1]["batch_in_epoch"] > 0
    assert read_manifest(store, "cut") == committed  # the held upload was never committed

    resumed = run_baton("run", str(spec), "--id", "cut", "--storage", url, env=env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert _resumed_from(resumed.stdout)[0] == committed["checkpoints"][-1]["step"]
    assert_same_training(reference, "reference", store, "cut")


@pytest.mark.slow
def test_corrupt_latest_checkpoint_falls_back_and_stays_bit_exact(held_setup, reference, gateway, tmp_path):
    spec, url, store, env = held_setup
    proc = start_baton("run", str(spec), "--id", "cut", "--storage", url, env=env, log=tmp_path / "cut.log")

    def two_committed_one_mid_epoch(manifest: dict) -> bool:
        # periodic checkpoints are skipped while one is in flight (as many as a slow machine's uploads
        # take): only the first (step 2, mid-epoch, nothing in flight before it) is sure to be taken
        last_two = manifest["checkpoints"][-2:]
        return (not manifest.get("completed") and len(last_two) == 2
                and any(e["kind"] == "step" and e["batch_in_epoch"] > 0 for e in last_two))

    # held at its next commit: however fast the job, it cannot commit (nor finish) before it is killed
    committed = kill_frozen(proc, gateway, store, "cut", two_committed_one_mid_epoch, log=tmp_path / "cut.log")
    latest, previous = committed["checkpoints"][-1], committed["checkpoints"][-2]
    data = bytearray(store.get_bytes(latest["key"]))
    data[len(data) // 3] ^= 0x01  # one flipped bit
    store.put_bytes(latest["key"], bytes(data))

    resumed = run_baton("run", str(spec), "--id", "cut", "--storage", url, env=env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"step-{latest['step']}.pt: sha256 does not match" in resumed.stdout and "falling back" in resumed.stdout
    assert _resumed_from(resumed.stdout)[0] == previous["step"]
    assert_same_training(reference, "reference", store, "cut")


@pytest.mark.slow
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
