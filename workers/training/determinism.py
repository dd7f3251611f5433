"""The reproducible configuration: deterministic kernels and a pinned intra-op thread count.

A job's thread count is part of its bits (a reduction split over two threads rounds differently than
over one). With ``resources.cpu_threads`` unset it is ``MACHINE_THREADS``: the count torch chooses in
a fresh process on this machine (its cores, or OMP_NUM_THREADS), read when this module is first
imported, before any of baton's processes changes it. `baton run`, a worker's training process and
every rank therefore start from the same number, and the checkpoint records it for every resume.

CUDA's cuBLAS needs CUBLAS_WORKSPACE_CONFIG in the environment before its first call, so entry
points call ``prepare_process()`` before any CUDA work.
"""
from __future__ import annotations

import os

import torch

from baton.schemas.errors import PermanentError

CUBLAS_WORKSPACE_CONFIG = ":4096:8"

# read before anything sets a count: a worker's forkserver imports this module before it pins its own
# thread to one (``workers/attempt/preload.py``), and its training processes inherit the value
MACHINE_THREADS = torch.get_num_threads()


def prepare_process() -> None:
    """Set what must be set before CUDA initialises (harmless without CUDA)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG)


def configure(deterministic: bool, cpu_threads: int) -> None:
    """Apply the job's determinism and thread count to this process."""
    prepare_process()
    torch.use_deterministic_algorithms(deterministic)
    torch.backends.cudnn.benchmark = not deterministic
    torch.backends.cudnn.deterministic = deterministic
    torch.set_num_threads(cpu_threads)


def resolve_device(requested: str) -> torch.device:
    """``auto`` -> cuda when visible, else cpu. Asking for cuda on a node without one is an error,
    never a silent CPU run."""
    cuda = torch.cuda.is_available()
    if requested == "cuda" and not cuda:
        raise PermanentError("resources.device is cuda but this worker sees no CUDA device: not training on the CPU "
                             "instead (route GPU jobs to a queue only GPU workers serve)")
    if requested == "auto":
        return torch.device("cuda" if cuda else "cpu")
    return torch.device(requested)
