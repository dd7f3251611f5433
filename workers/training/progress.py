"""Where training stands, and the best-checkpoint tracker: both travel in every checkpoint."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Callable, Optional


@dataclass
class Progress:
    """The data position and the running sums since the last validation (all plain numbers).

    For epoch-based runs the sums cover the epoch; with ``eval_every_steps`` or ``max_steps`` they
    cover the interval since the previous validation (the names are kept for old checkpoints).
    """

    epoch: int = 0  # passes over the training data completed
    batch_in_epoch: int = 0  # batches of this pass consumed
    global_step: int = 0  # optimizer steps completed
    micro_step: int = 0  # micro-batches completed, all epochs
    nonfinite_steps: int = 0  # optimizer steps skipped for a non-finite loss, all epochs
    epoch_loss_sum: float = 0.0  # sum over samples of the training loss, since the last validation
    epoch_samples: int = 0
    epoch_grad_norm_sum: float = 0.0
    epoch_grad_norm_max: float = 0.0
    epoch_steps: int = 0  # optimizer steps with a finite gradient norm, this epoch
    epoch_sample_offset: int = 0  # samples of this pass consumed before its batch 0 (a resharded resume's)
    curve_from: int = 0  # the step the interval's per-step training curve starts after
    curve: list = field(default_factory=list)  # [bucket, loss sum, samples, lr] of this interval, in step order

    def record_curve(self, step_index: int, value: float, samples: int, every: int, lr: Optional[float] = None) -> None:
        """A finite micro-batch loss of optimizer step ``step_index`` (0-based), for the per-step training
        curve: summed into its bucket of ``every`` steps; ``lr``, the learning rate of that step, is the
        bucket's (its last step's) when known."""
        bucket = step_index // every
        if self.curve and self.curve[-1][0] == bucket:
            self.curve[-1][1] += value * samples
            self.curve[-1][2] += samples
            if lr is not None:
                self.curve[-1][3:] = [lr]  # (an entry of a checkpoint written before it held one: now it does)
        else:
            self.curve.append([bucket, value * samples, samples, lr])

    def train_curve(self, every: int, sum_over_ranks: Callable[..., list[float]]) -> list[tuple[int, float]]:
        """The interval's per-step training curve: (step, mean loss) per bucket of ``every`` steps (over every
        rank's samples, added up by ``sum_over_ranks``: one sum for all buckets), the last one ending here."""
        buckets = self.curve_buckets(every)
        if not buckets:
            return []
        held = {entry[0]: (entry[1], entry[2]) for entry in self.curve}
        sums = sum_over_ranks(*(held.get(b, (0.0, 0))[0] for b in buckets),
                              *(float(held.get(b, (0.0, 0))[1]) for b in buckets))
        totals, samples = sums[:len(buckets)], sums[len(buckets):]
        return [(min((b + 1) * every, self.global_step), t / n) for b, t, n in zip(buckets, totals, samples) if n]

    def lr_curve(self, every: int) -> list[tuple[int, float]]:
        """The interval's learning rate, step by step: (step, its rate) at each point of the training curve
        (the rate of the bucket's last step; the same on every rank)."""
        return [(min((entry[0] + 1) * every, self.global_step), entry[3]) for entry in self.curve
                if len(entry) > 3 and entry[3] is not None and entry[2]]

    def curve_buckets(self, every: int) -> list[int]:
        """Every bucket of the interval up to now, with or without samples (the same on every rank)."""
        return list(range(self.curve_from // every, (self.global_step - 1) // every + 1)) if self.global_step else []

    def state_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict) -> "Progress":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in state.items() if k in known})

    def record_grad_norm(self, norm: float) -> None:
        if math.isfinite(norm):
            self.epoch_grad_norm_sum += norm
            self.epoch_grad_norm_max = max(self.epoch_grad_norm_max, norm)
            self.epoch_steps += 1

    def start_next_epoch(self) -> None:
        self.start_next_pass()
        self.start_next_interval()

    def start_next_pass(self) -> None:
        self.epoch += 1
        self.batch_in_epoch = 0
        self.epoch_sample_offset = 0

    def start_next_interval(self) -> None:
        self.curve_from, self.curve = self.global_step, []
        self.epoch_loss_sum = 0.0
        self.epoch_samples = 0
        self.epoch_grad_norm_sum = 0.0
        self.epoch_grad_norm_max = 0.0
        self.epoch_steps = 0


@dataclass
class BestTracker:
    """The best value of the monitored metric so far, and where it was reached."""

    metric: str
    mode: str  # min | max
    value: Optional[float] = None
    step: Optional[int] = None
    epoch: Optional[int] = None  # the epoch it was reached in, counting from 1

    def improves(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.value is None:
            return True
        return value < self.value if self.mode == "min" else value > self.value

    def update(self, value: float, step: int, epoch: int) -> bool:
        """Record ``value``; True when it is a new best."""
        if not self.improves(value):
            return False
        self.value, self.step, self.epoch = value, step, epoch
        return True

    def state_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict) -> "BestTracker":
        return cls(**state)
