"""What a job's ``manifest.json`` holds: the committed checkpoints (newest last), and references to
every other object of the job readers may use (best, metrics, final artifacts).

An object exists for readers only once it is referenced here; readers never use a well-known key.
The manifest is replaced whole, with a compare-and-swap on its previous version, so a crash leaves
the old or the new one.
"""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

MANIFEST_VERSION = 2


class ObjectRef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str = Field(description="Object key relative to the store root.")
    size: int = Field(description="Bytes.")
    sha256: str = Field(description="Hex digest of the bytes.")


class CheckpointEntry(ObjectRef):
    step: int = Field(description="Optimizer steps completed when it was taken.")
    epoch: int = Field(description="Epoch the loop resumes in.")
    batch_in_epoch: int = Field(description="Batches of that epoch already consumed.")
    kind: Literal["step", "epoch", "eval", "stop"] = Field(description="step: every_steps; epoch: after an epoch's validation; eval: after an eval_every_steps or final validation; stop: preemption/cancel.")
    attempt: int = Field(description="The attempt that wrote it.")
    created_at: float = Field(description="Unix time of the commit.")
    files: Optional[list[ObjectRef]] = Field(
        None, description="A sharded checkpoint's objects (resources.strategy: fsdp): key is then their common "
        "prefix, a torch.distributed.checkpoint directory (.metadata and each rank's shard) with each rank's own "
        "state (rank-<r>.pt); size is their sum and sha256 the digest of their listing (sharded_digest). None: one "
        "torch.save object at key.")

    def object_keys(self) -> list[str]:
        """The objects this checkpoint consists of."""
        return [ref.key for ref in self.files] if self.files is not None else [self.key]


def sharded_digest(files: list[ObjectRef]) -> str:
    """A sharded checkpoint's sha256: of its files' listing (key, size, sha256 per line, sorted by key)."""
    import hashlib

    listing = "".join(f"{ref.key} {ref.size} {ref.sha256}\n" for ref in sorted(files, key=lambda ref: ref.key))
    return hashlib.sha256(listing.encode()).hexdigest()


class BestEntry(CheckpointEntry):
    """The manifest entry of the best checkpoint (its own object, kept out of rotation)."""

    metric: str = Field(description="The monitored metric.")
    value: float = Field(description="Its value at this checkpoint.")


class MetricsRef(ObjectRef):
    step: int = Field(description="The checkpoint whose metrics rows these are.")
    attempt: int = Field(description="The attempt that wrote them.")


class FinalArtifacts(BaseModel):
    model_config = ConfigDict(extra="forbid")

    attempt: int = Field(description="The attempt that finished the job.")
    model: ObjectRef = Field(description="model.safetensors: the last step's weights only, for consumers.")
    best_model: Optional[ObjectRef] = Field(
        None, description="best.safetensors: the best checkpoint's weights only; when that checkpoint no longer "
        "verifies, the best committed one's that does (report.json's best.weights_note says so). None when no value "
        "was ever finite or no such checkpoint verifies.")
    report: ObjectRef = Field(description="report.json: the run's summary.")
    curves: ObjectRef = Field(description="curves.png.")


class Reshard(BaseModel):
    step: int = Field(description="The step of the checkpoint that was loaded onto another number of ranks.")
    from_ranks: int = Field(description="Ranks that wrote it.")
    to_ranks: int = Field(description="Ranks that loaded it (resources.reshard).")
    attempt: int = Field(description="The attempt that resharded it.")

    def describe(self) -> str:
        return (f"resharded from {self.from_ranks} to {self.to_ranks} rank(s) at step {self.step}: not bit-exact "
                f"with a {self.from_ranks}-rank run")


class CheckpointManifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = MANIFEST_VERSION
    job_id: str
    attempt: int = Field(0, description="Highest attempt that has written this manifest; older attempts are fenced out.")
    claim: Optional[str] = Field(
        None, description="Nonce of the claim that holds `attempt` (with it, the fencing token): a second claim of the "
        "same attempt number (Redis lost the first, or came back behind the manifest) is fenced out too.")
    checkpoints: list[CheckpointEntry] = Field(default_factory=list, description="Committed checkpoints, oldest first.")
    best: Optional[BestEntry] = Field(None, description="The best checkpoint by checkpoint.monitor; never rotated.")
    metrics: Optional[MetricsRef] = Field(None, description="metrics.jsonl as of the latest checkpoint that carried rows.")
    resumed_from: Optional[int] = Field(None, description="Step the current attempt resumed from; never rotated away.")
    resumed_from_key: Optional[str] = Field(None, description="Object key of that checkpoint.")
    reshards: list[Reshard] = Field(
        default_factory=list, description="Where the job's state was loaded onto another number of ranks (a run "
        "that is not bit-exact with one that kept its count), oldest first; those after the current resume point "
        "are dropped.")
    completed: bool = Field(False, description="The job finished and its final artifacts are written.")
    final: Optional[FinalArtifacts] = Field(None, description="The final artifacts (set with completed).")

    @property
    def latest(self) -> Optional[CheckpointEntry]:
        return self.checkpoints[-1] if self.checkpoints else None

    def referenced_keys(self) -> set[str]:
        """Every object key this manifest refers to: what garbage collection must keep."""
        keys = {key for entry in self.checkpoints for key in entry.object_keys()}
        if self.best is not None:
            keys.update(self.best.object_keys())
        if self.metrics is not None:
            keys.add(self.metrics.key)
        if self.resumed_from_key is not None:
            keys.add(self.resumed_from_key)
            resumed = next((e for e in self.checkpoints if e.key == self.resumed_from_key), None)
            if resumed is not None:
                keys.update(resumed.object_keys())
        if self.final is not None:
            final = self.final
            keys |= {ref.key for ref in (final.model, final.best_model, final.report, final.curves) if ref is not None}
        return keys
