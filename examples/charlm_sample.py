"""Generate text with the best weights of an examples/charlm.yaml (or charlm_fsdp.yaml) job.

    baton run examples/charlm.yaml --id charlm-1                 # or: baton submit ... to workers
    python examples/charlm_sample.py charlm-1 --prompt "def "    # storage: --storage, BATON_STORAGE_URL, ./baton-data

It finds the job's weights through its manifest (file:// or s3://): the finished job's
best.safetensors, or, while it runs, its best checkpoint (one not sharded); checks their sha256,
loads them into a fresh CharTransformer built from the job's own spec, and samples.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import safetensors.torch  # noqa: E402
import torch  # noqa: E402

from baton.schemas.spec import JobSpec  # noqa: E402
from baton.storage.artifacts import read_verified  # noqa: E402
from baton.storage.checkpoint_io import load_bytes  # noqa: E402
from baton.storage.layout import JobPaths  # noqa: E402
from baton.storage.manifest_store import ManifestStore  # noqa: E402
from baton.storage.stores.open import open_store  # noqa: E402
from baton.workers.training.builtins.gpt import char_transformer  # noqa: E402


def load_best(job_id: str, storage_url: str) -> torch.nn.Module:
    store, paths = open_store(storage_url), JobPaths(job_id)
    spec = JobSpec.parse(json.loads(store.get_bytes(paths.spec)))
    manifest = ManifestStore(store, paths).read()
    best, model = manifest.best, char_transformer(**spec.model.kwargs)
    if manifest.final is not None and manifest.final.best_model is not None:  # the finished job's one file
        ref = manifest.final.best_model
        model.load_state_dict(safetensors.torch.load(read_verified(store, ref)))
        print(f"loaded {ref.key}", file=sys.stderr)
        return model.eval()
    if best is None or best.files is not None:
        sys.exit(f"job {job_id} has no best weights yet" if best is None else
                 f"job {job_id} is sharded: its best.safetensors is written when it finishes")
    state = load_bytes(store.get_bytes(best.key), best.sha256, where=best.key)
    model.load_state_dict(state["model"])
    print(f"loaded {best.key} (step {best.step}, {best.metric} {best.value:.3f})", file=sys.stderr)
    return model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job_id")
    parser.add_argument("--storage", default=os.environ.get("BATON_STORAGE_URL", f"file://{Path('baton-data').resolve()}"))
    parser.add_argument("--prompt", default="def ")
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    model = load_best(args.job_id, args.storage)
    ids = torch.tensor([list(args.prompt.encode())], dtype=torch.long)
    out = model.generate(ids, args.tokens, args.temperature, torch.Generator().manual_seed(args.seed))
    print(bytes(out[0].tolist()).decode("utf-8", errors="replace"))


if __name__ == "__main__":
    main()
