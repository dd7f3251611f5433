"""How many GPUs this process can give a job's ranks, asked of torch only where a GPU driver shows a
device file: a worker's main process does not import torch (about 1 s of a core and 200 MB at every
start) to learn that a CPU-only node has none.

A GPU is visible to torch only through its driver's device files: NVIDIA's ``/dev/nvidiactl``, AMD's
ROCm ``/dev/kfd``, WSL 2's ``/dev/dxg``, Jetson's ``/dev/nvhost-ctrl``. Where none exists, or where a
container runtime says it gave NVIDIA devices (``NVIDIA_VISIBLE_DEVICES``) that may be missing, torch
is asked as before.
"""
from __future__ import annotations

import os

DEVICE_FILES = ("/dev/nvidiactl", "/dev/kfd", "/dev/dxg", "/dev/nvhost-ctrl")


def nvidia_promised() -> bool:
    """The container runtime says this process was given NVIDIA devices."""
    return os.environ.get("NVIDIA_VISIBLE_DEVICES", "none") not in ("", "none", "void")


def may_have_gpus() -> bool:
    """Whether torch could see a GPU here; False only where it certainly cannot."""
    return nvidia_promised() or any(os.path.exists(path) for path in DEVICE_FILES)


def offered_gpus() -> int:
    if not may_have_gpus():
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
