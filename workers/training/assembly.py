"""A rank's loop, assembled the same way on every rank of every layout: its components built after
seeding, adopted by the layout, its checkpointer, the loop, and the checkpoint's state put back.
``run`` trains it to the end or to a stop, and releases what the checkpointer holds either way."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from baton.schemas.spec import JobSpec
from baton.storage.checkpointing.contract import CheckpointTarget
from baton.storage.memory.memory_copy import MemoryCopier
from baton.workers.training import rng
from baton.workers.training.components import build_components
from baton.workers.training.control import LoopControl
from baton.workers.training.layout import Layout
from baton.workers.training.loop import Outcome, TrainingLoop


@dataclass(frozen=True)
class RankPlan:
    """What one rank trains: the job's spec, the modules it may import, its intra-op threads, where its
    checkpoints go, the checkpoint state it resumes from (None: from the start), and where it pauses
    (``pause_at``: epochs done, or steps; None: it trains to its end)."""

    spec: JobSpec
    allowed_prefixes: tuple[str, ...]
    threads: int
    target: CheckpointTarget
    state: Optional[dict] = None
    pause_at: Optional[int] = None


def assemble(plan: RankPlan, layout: Layout, control: LoopControl,
             memory: Optional[MemoryCopier] = None) -> TrainingLoop:
    """The rank's loop, resumed where ``plan.state`` says; ``memory``: its copies in host memory (one
    process's state only)."""
    spec = plan.spec
    rng.seed_all(spec.seed)
    parts = build_components(spec, layout.device, plan.allowed_prefixes, layout.rank, layout.world_size,
                             prepare_model=layout.prepare_model)
    parts = layout.adopt(parts)
    loop: TrainingLoop  # the checkpointer reads the loop's progress at each save
    checkpointer = layout.checkpointer(parts, plan.target, lambda: loop.progress)
    try:
        restored = layout.restore(parts, plan.state) if plan.state is not None else None
    except BaseException:
        checkpointer.abandon()
        raise
    loop = TrainingLoop(parts, checkpointer, layout.control(control), plan.threads, layout, memory, restored,
                        plan.pause_at)
    return loop


def run(loop: TrainingLoop) -> Outcome:
    """Train ``loop`` to its end or a stop; its checkpointer is closed after (its last commit waited
    for), or abandoned when anything fails (nothing more is committed)."""
    try:
        outcome = loop.run()
    except BaseException:
        loop.checkpointer.abandon()
        raise
    loop.checkpointer.close()
    if loop.memory is not None:
        loop.memory.close()
        loop.control.log(loop.memory.stats.describe())
    if loop.layout.world_size > 1:
        loop.control.log(f"rank {loop.layout.rank}: {loop.checkpointer.describe()}")
    return outcome
