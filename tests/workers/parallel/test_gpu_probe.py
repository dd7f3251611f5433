"""A worker's main process asks torch about GPUs only where a GPU driver or a device list may give it
one: on this machine, with no driver, it learns "none" without importing torch; where a driver's file
appears or a device list is set, it asks torch, which has the last word."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

from baton.workers.parallel import gpu_probe
from tests.helpers import REPO

PROBE = """
import json, sys
from baton.workers.parallel import gpu_probe
if len(sys.argv) > 1:
    gpu_probe.DRIVER_PATHS = (sys.argv[1],)
gpus = gpu_probe.offered_gpus()
from baton.workers.queue.bootstrap import device_banner
banner = device_banner()
print(json.dumps({"gpus": gpus, "torch": "torch" in sys.modules, "banner": banner}))
"""
LISTS = ("NVIDIA_VISIBLE_DEVICES", *gpu_probe.DEVICE_LISTS)


def probe(*args: str, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in LISTS}
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=REPO,
                          env={**clean, **env}, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


NO_DRIVER = pytest.mark.skipif(any(glob.glob(pattern) for pattern in gpu_probe.DRIVER_PATHS),
                               reason="this machine has a GPU driver")


@NO_DRIVER
def test_a_node_without_a_gpu_driver_offers_none_without_importing_torch():
    from importlib import metadata

    seen = probe()
    assert seen["gpus"] == 0 and not seen["torch"]
    assert f"torch {metadata.version('torch')}; no GPU driver on this node" in seen["banner"], seen["banner"]


@NO_DRIVER
@pytest.mark.parametrize("env,may", [({"NVIDIA_VISIBLE_DEVICES": "none"}, False), ({"NVIDIA_VISIBLE_DEVICES": "void"}, False),
                                     ({"NVIDIA_VISIBLE_DEVICES": ""}, False), ({"NVIDIA_VISIBLE_DEVICES": "all"}, True),
                                     ({"CUDA_VISIBLE_DEVICES": "0"}, True), ({"HIP_VISIBLE_DEVICES": "0"}, True),
                                     ({"ROCR_VISIBLE_DEVICES": "0"}, True)])
def test_a_device_list_set_for_the_process_means_torch_is_asked(monkeypatch, env, may):
    for name in LISTS:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert gpu_probe.may_have_gpus() is may


def test_where_a_driver_is_torch_is_asked_and_has_the_last_word(tmp_path):
    import torch

    driver = tmp_path / "nvidia"
    driver.mkdir()
    seen = probe(str(driver))
    assert seen["torch"] and seen["gpus"] == torch.cuda.device_count()  # no CUDA here: both 0; a GPU: its count
    assert f"torch {torch.__version__}, CUDA build" in seen["banner"], seen["banner"]
