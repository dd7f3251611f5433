"""The spec's ``resources`` (where and on what a job runs, and its place in its queue's pool) and
``retry`` sections."""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from baton.schemas.section import NAME_PATTERN, Section

PRIORITY_LIMIT = 1_000_000_000
"""resources.priority lies within +-this (as Kubernetes' PriorityClass values)."""


class ResourcesSpec(Section):
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: cuda when the worker has one, else cpu.")
    queue: str = Field("default", pattern=NAME_PATTERN, description="Celery queue the job is routed to.")
    priority: int = Field(
        0, ge=-PRIORITY_LIMIT, le=PRIORITY_LIMIT,
        description="Higher starts first among the jobs waiting on its queue. Not part of the reproducible "
                    "configuration.")
    team: str = Field(
        "default", pattern=NAME_PATTERN,
        description="The team whose worker slots (`baton quota`) the job uses; among waiting jobs of one priority, the "
                    "team furthest below its quota starts first.")
    cpu_threads: Optional[int] = Field(
        None, gt=0, le=1024,
        description="torch intra-op threads per process; null: the count torch chooses in a fresh process on the "
                    "machine of the first attempt (its cores, or OMP_NUM_THREADS), divided among the ranks of a "
                    "data-parallel job on the CPU; the same in `baton run` and on a worker, recorded in every "
                    "checkpoint and re-applied on every resume.",
    )
    processes: int = Field(
        1, ge=1, le=64,
        description="Data-parallel ranks on one node (torch.distributed: gloo on cpu, NCCL on cuda, one GPU per rank); "
                    "data.batch_size is per rank, so a step's global batch is processes x batch_size. Part of the "
                    "reproducible configuration: a job resumes only with the same count, unless resources.reshard.",
    )
    nodes: int = Field(
        1, ge=1, le=64,
        description="Workers (nodes) the job runs on at once, each with resources.processes ranks: a gang admitted "
                    "all or nothing from the job's queue, its ranks joined through torch.distributed's TCP store on "
                    "the first worker (the leader). Part of the reproducible configuration, as processes.",
    )
    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description="How the ranks share the work. ddp: every rank holds the whole model and optimizer state "
                    "(DistributedDataParallel). fsdp: parameters, gradients and optimizer state are sharded over the "
                    "ranks (FSDP2's fully_shard, one unit per block: the model's shard_units() if it has one, else "
                    "its children with parameters), bf16 through FSDP's mixed-precision policy, and checkpoints are "
                    "sharded in torch.distributed.checkpoint's format, each rank writing its own shard.",
    )
    reshard: bool = Field(
        False,
        description="fsdp only: resume from a checkpoint written by another number of ranks (resources.processes "
                    "changed) instead of refusing. The model and optimizer state are resharded exactly, and the data "
                    "position continues by global samples consumed: no sample of the interrupted epoch is skipped "
                    "or served twice. The run is not bit-exact with one that kept its rank count, and says so "
                    "(the log, the manifest and the report).",
    )


    @property
    def ranks(self) -> int:
        """The job's world size: nodes x processes."""
        return self.nodes * self.processes

    @property
    def single_process(self) -> bool:
        """Whether one process holds the job's whole state (a sharded job of one rank is a group of one:
        its checkpoints are sharded ones)."""
        return self.ranks == 1 and self.strategy == "ddp"


class RetrySpec(Section):
    max_attempts: int = Field(3, gt=0, le=100, description="Attempts in all, counting the first; only infrastructure loss is retried.")
