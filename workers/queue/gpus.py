"""``baton worker --gpus``: which worker process gets which GPU.

Each child process sees exactly one device through CUDA_VISIBLE_DEVICES (so ``cuda`` means its
own GPU and nothing else), or ``--gpus-per-job K`` of them: a worker process for data-parallel jobs
of up to K ranks (``resources.processes``), one rank per GPU. Indices in ``--gpus`` count the devices *this* process can see: when
the platform already narrowed CUDA_VISIBLE_DEVICES (Kubernetes, Slurm, docker --gpus), child i
gets the i-th of those, by the same id or UUID the platform used.
"""
from __future__ import annotations

from typing import Optional


def visible_devices(env: dict[str, str], device_count: int) -> list[str]:
    """The device ids this process may hand out, in CUDA order."""
    narrowed = env.get("CUDA_VISIBLE_DEVICES")
    if narrowed is not None:
        return [d.strip() for d in narrowed.split(",") if d.strip()]
    return [str(i) for i in range(device_count)]


def parse_gpus(text: str, visible: list[str]) -> list[int]:
    """``all`` or comma-separated indices into ``visible``; ValueError naming what is wrong."""
    if not visible:
        raise ValueError("--gpus: no CUDA device is visible to this worker (check the driver, the container's GPU "
                         "reservation, CUDA_VISIBLE_DEVICES)")
    if text.strip() == "all":
        return list(range(len(visible)))
    try:
        indices = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"--gpus must be 'all' or comma-separated GPU indices like 0,1 (got {text!r})") from None
    if len(set(indices)) != len(indices):
        raise ValueError(f"--gpus lists a GPU twice ({text!r}): each GPU runs one job")
    out_of_range = [i for i in indices if not 0 <= i < len(visible)]
    if out_of_range:
        raise ValueError(f"--gpus {out_of_range} out of range: this worker sees {len(visible)} GPU(s), 0..{len(visible) - 1}")
    return indices


def child_environments(indices: list[int], visible: list[str], metrics_port: int,
                       per_job: int = 1) -> list[dict[str, str]]:
    """One environment per child process: its GPUs (``per_job`` of them, consecutive in ``indices``:
    a data-parallel job's ranks use them as cuda:0..per_job-1) and its own metrics port."""
    if len(indices) % per_job:
        raise ValueError(f"--gpus-per-job {per_job} does not divide the {len(indices)} GPU(s) of --gpus")
    groups = [indices[i:i + per_job] for i in range(0, len(indices), per_job)]
    return [{"CUDA_VISIBLE_DEVICES": ",".join(visible[index] for index in group),
             "BATON_METRICS_PORT": str(metrics_port + n if metrics_port else 0)}
            for n, group in enumerate(groups)]


def plan(gpus: Optional[str], concurrency: int, env: dict[str, str], device_count: int,
         metrics_port: int, per_job: int = 1) -> list[dict[str, str]]:
    """The extra environment of each worker process ``baton worker`` should start."""
    if gpus is not None:
        visible = visible_devices(env, device_count)
        return child_environments(parse_gpus(gpus, visible), visible, metrics_port, per_job)
    if per_job != 1:
        raise ValueError("--gpus-per-job needs --gpus")
    return [{"BATON_METRICS_PORT": str(metrics_port + n if metrics_port else 0)} for n in range(concurrency)]
