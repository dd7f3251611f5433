"""How many GPUs this process can give a job's ranks, without importing torch where there is positive
evidence that no GPU driver is present: a worker's main process does not import torch (about 1 s of a
core and 180 MB at every start) to learn that a CPU-only node has none.

No driver means: no NVIDIA, AMD or Jetson kernel module loaded (``/proc/driver/nvidia``,
``/sys/module/{nvidia,amdgpu,nvgpu}``), no GPU device file (``/dev/nvidia*``, ``/dev/nvgpu*``,
``/dev/nvhost-*``, ROCm's ``/dev/kfd``, WSL 2's ``/dev/dxg``), and no device list set for the process
(``NVIDIA_VISIBLE_DEVICES`` naming devices, ``CUDA_VISIBLE_DEVICES``, ``HIP_VISIBLE_DEVICES``,
``ROCR_VISIBLE_DEVICES``). Any one of them, and torch is asked, and has the last word.
"""
from __future__ import annotations

import glob
import os

DRIVER_PATHS = ("/proc/driver/nvidia", "/sys/module/nvidia", "/sys/module/amdgpu", "/sys/module/nvgpu",
                "/dev/nvidia*", "/dev/nvgpu*", "/dev/nvhost-*", "/dev/kfd", "/dev/dxg")
DEVICE_LISTS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def nvidia_promised() -> bool:
    """The container runtime says this process was given NVIDIA devices."""
    return os.environ.get("NVIDIA_VISIBLE_DEVICES", "none") not in ("", "none", "void")


def may_have_gpus() -> bool:
    """Whether torch could see a GPU here; False only where no sign of a GPU driver or device list exists."""
    return (nvidia_promised() or any(name in os.environ for name in DEVICE_LISTS)
            or any(glob.glob(pattern) for pattern in DRIVER_PATHS))


def offered_gpus() -> int:
    """The GPUs torch sees; 0 without asking it where ``may_have_gpus`` is False."""
    return seen_by_torch() if may_have_gpus() else 0


def seen_by_torch() -> int:
    """The GPUs torch sees (imports torch)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
