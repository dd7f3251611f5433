"""Paying a worker's one-time costs at start rather than in a job's recovery time.

The first training step in a process imports about 800 modules (the first optimizer.step()
brings in torch._dynamo and sympy): about 1 s on a 2-core machine. A worker that takes over a
preempted job would add that to the job's downtime, so every worker does one tiny step of each kind
before it reports ready. (A training process reaches the store through its worker's gate,
``baton.storage.stores.gated``: it has no S3 client of its own to warm.)
Each job seeds every RNG itself, so this leaves no trace in any result.
"""
from __future__ import annotations

import io
import os

import torch
from torch.utils.data import DataLoader, TensorDataset


def warm_up() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.1), torch.nn.Linear(4, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.zeros(8, dtype=torch.long)), batch_size=4,
                        generator=torch.Generator().manual_seed(0))
    for x, y in loader:
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    buffer.seek(0)
    torch.load(buffer, weights_only=True)
    if os.environ.get("MLFLOW_TRACKING_URI"):
        try:
            import mlflow  # noqa: F401  ~2.5 s of imports, paid here rather than by a job's tracker
        except ImportError:
            pass  # the job says so in its log
