"""A user module whose import is expensive and has effects (as importing a large library is): it
marks the file named by IMPORT_MARK when imported. Validating a spec that names it must not import it."""
import os
from pathlib import Path

Path(os.environ["IMPORT_MARK"]).write_text("imported")

import torch  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402


def model(width: int, depth: int = 2) -> torch.nn.Module:
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(depth)])


class Pairs(TensorDataset):
    def __init__(self, n: int, seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        super().__init__(torch.randn(n, 2, generator=generator), torch.randint(0, 2, (n,), generator=generator))
