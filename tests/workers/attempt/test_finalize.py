"""What a finished job leaves for consumers: weights that load into the model class as PyTorch loads
any state_dict, tied weights included."""
from __future__ import annotations

import pytest

import subprocess
import sys

import torch

from baton.schemas.manifest import CheckpointManifest
from baton.storage.artifacts import final_files
from baton.storage.stores.file_store import FileStore
from tests.helpers import make_spec, read_manifest

TIED = {"target": "builtin:char_transformer", "kwargs": {"block": 16, "width": 32, "layers": 1, "heads": 2}}
LOAD = """
import sys, torch
from safetensors.torch import load_file
from baton.workers.training.builtins import char_transformer
for path in sys.argv[1:]:
    model = char_transformer(block=16, width=32, layers=1, heads=2)
    result = model.load_state_dict(load_file(path), strict=True)
    assert model.head.weight is model.tokens.weight, "the tie is kept"
    print(path, result, "torch.distributed initialized:", torch.distributed.is_initialized())
"""


@pytest.mark.slow
def test_a_model_with_tied_weights_loads_its_exported_weights_strictly_in_a_fresh_process(run_job, tmp_path):
    spec = make_spec(model=TIED,
                     data={"target": "builtin:stdlib_text", "kwargs": {"block": 16, "max_bytes": 20000},
                           "val": {"target": "builtin:stdlib_text", "kwargs": {"part": "val", "block": 16,
                                                                              "max_bytes": 20000}},
                           "batch_size": 8, "val_fraction": None},
                     task={"target": "builtin:language_model"}, scheduler={"name": "none"},
                     loop={"epochs": None, "max_steps": 6, "eval_every_steps": 3},
                     checkpoint={"every_steps": None, "monitor": "val_loss"})
    _, root, job = run_job(spec)
    store = FileStore(root)
    manifest = CheckpointManifest.model_validate(read_manifest(store, job))
    files = final_files(manifest)
    paths = []
    for name in ("model.safetensors", "best.safetensors"):
        path = tmp_path / name
        path.write_bytes(store.get_bytes(files[name].key))
        paths.append(str(path))
    done = subprocess.run([sys.executable, "-c", LOAD, *paths], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("<All keys matched successfully>") == 2 and "initialized: False" in done.stdout

    from safetensors.torch import load_file

    best = torch.load(root / manifest.best.key, weights_only=True)["model"]
    exported = load_file(paths[1])
    assert exported.keys() == best.keys() and all(torch.equal(exported[k], best[k]) for k in best)
