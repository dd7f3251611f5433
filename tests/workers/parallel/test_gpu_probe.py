"""A worker's main process asks torch about GPUs only where a GPU driver's device file exists (or a
container runtime promised NVIDIA devices): on this CPU-only machine it learns "none" without importing
torch, and where a device file appears it asks torch, which has the last word."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from baton.workers.parallel import gpu_probe
from tests.helpers import REPO

pytestmark = pytest.mark.skipif(any(os.path.exists(path) for path in gpu_probe.DEVICE_FILES),
                                reason="this machine has a GPU driver's device file")

PROBE = """
import json, sys
from baton.workers.parallel import gpu_probe
if len(sys.argv) > 1:
    gpu_probe.DEVICE_FILES = (sys.argv[1],)
gpus = gpu_probe.offered_gpus()
from baton.workers.queue.bootstrap import device_banner
print(json.dumps({"gpus": gpus, "torch": "torch" in sys.modules, "banner": device_banner()}))
"""


def probe(*args: str, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k != "NVIDIA_VISIBLE_DEVICES"}
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=REPO,
                          env={**clean, **env}, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_node_without_a_gpu_device_file_offers_none_without_importing_torch():
    from importlib import metadata

    seen = probe()
    assert seen["gpus"] == 0 and not seen["torch"]
    assert f"torch {metadata.version('torch')}; no CUDA device visible" in seen["banner"], seen["banner"]


@pytest.mark.parametrize("how", ["device file", "NVIDIA_VISIBLE_DEVICES"])
def test_where_a_gpu_may_be_torch_is_asked_and_has_the_last_word(tmp_path, how):
    import torch

    device = tmp_path / "nvidiactl"
    device.touch()
    seen = probe(str(device)) if how == "device file" else probe(NVIDIA_VISIBLE_DEVICES="all")
    assert seen["torch"] and seen["gpus"] == torch.cuda.device_count()  # 0 here: torch sees no CUDA
    assert f"torch {torch.__version__}, CUDA build" in seen["banner"], seen["banner"]
