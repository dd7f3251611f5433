"""What shipping a job's code costs at submit: a directory of ``--mb`` megabytes (Python sources, and
some incompressible binary files as a project's small assets are) packed, hashed and stored.

Measured side by side in one run, on a real redis-server and S3 endpoint (moto over HTTP):

- **pack s**: baton's archive (sorted, gzip level 1) and its sha256, in this process;
- **tar s**: ``tar czf`` of the same directory (GNU tar, gzip's default level 6): what a user would
  otherwise run before copying their code to a bucket by hand;
- **upload s**: storing baton's archive in the S3 bucket (one PUT);
- **submit s**: ``JobClient.submit(spec, code=DIR)`` whole (validation, packing, the upload, the job's
  records), for a directory not stored before; **beyond upload s** is submit minus upload;
- **again s**: the same submit once more: the archive is already stored (a sweep's other trials).

    python bench/code_ship.py [--mb 50] [--repeats 3] [--out bench/results/code_ship.json]

``--mb 2 --repeats 1`` is a CI-sized case (tests/bench).
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from baton.jobs.code_pack import pack  # noqa: E402
from baton.jobs.services import RedisServer, S3Server  # noqa: E402
from baton.storage.layout import code_key  # noqa: E402
from baton.storage.stores.open import open_store  # noqa: E402
from bench.loop_overhead import write_result  # noqa: E402

SPEC = {"name": "ship", "model": {"target": "builtin:mlp", "kwargs": {"in_features": 2, "out_features": 3}},
        "data": {"target": "builtin:spiral"}, "optimizer": {"name": "adamw", "lr": 1e-3}, "loop": {"epochs": 1}}
BINARY_SHARE = 0.3
"""Of the directory's bytes, the share in incompressible files (icons, small fixtures, a tokenizer)."""


def make_project(root: Path, megabytes: float, seed: int) -> tuple[int, int]:
    """Python modules of ~20 KB and binary files of ~1 MB, ``megabytes`` in all; (files, bytes)."""
    rng = random.Random(seed)
    total, files, target = 0, 0, int(megabytes * 1e6)
    words = ["def", "return", "self", "tensor", "import", "torch", "layer", "for", "in", "range", "x", "=", "+"]
    while total < target * (1 - BINARY_SHARE):
        path = root / f"pkg{files % 20}" / f"module_{files}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        text = "\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(330)) + "\n"
        path.write_text(text)
        total, files = total + len(text), files + 1
    while total < target:
        data = rng.randbytes(1_000_000)
        (root / "assets").mkdir(exist_ok=True)
        (root / "assets" / f"blob_{files}.bin").write_bytes(data)
        total, files = total + len(data), files + 1
    for package in root.glob("pkg*"):
        (package / "__init__.py").write_text("")
    return files, total


def one_round(root: Path, index: int, megabytes: float, client, store) -> dict:
    project = root / f"project-{index}"
    files, size = make_project(project, megabytes, seed=index)
    started = time.perf_counter()
    packed = pack(project, limit_bytes=None)
    pack_s = time.perf_counter() - started
    started = time.perf_counter()
    subprocess.run(["tar", "czf", str(root / f"tar-{index}.tgz"), "-C", str(project), "."], check=True)
    tar_s = time.perf_counter() - started
    started = time.perf_counter()
    store.put_bytes(f"bench-upload/{index}", packed.data)
    upload_s = time.perf_counter() - started
    started = time.perf_counter()
    client.submit(SPEC, f"ship-{index}", code=project)
    submit_s = time.perf_counter() - started
    assert store.exists(code_key(packed.digest))
    started = time.perf_counter()
    client.submit(SPEC, f"ship-{index}-again", code=project)
    again_s = time.perf_counter() - started
    return {"files": files, "mb": size / 1e6, "archive_mb": len(packed.data) / 1e6, "pack_s": pack_s, "tar_s": tar_s,
            "upload_s": upload_s, "submit_s": submit_s, "beyond_upload_s": submit_s - upload_s, "again_s": again_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=50.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="bench/results/code_ship.json")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="baton-code-ship-"))
    redis, s3 = RedisServer().start(), S3Server().start()
    try:
        s3.create_bucket("ship")
        os.environ.update({**s3.env(), "BATON_REDIS_URL": redis.url, "BATON_STORAGE_URL": "s3://ship/bench",
                           "BATON_CODE_LIMIT_MB": str(args.mb * 2)})
        from baton.jobs.client import JobClient

        client, store = JobClient(), open_store("s3://ship/bench")
        rows = [one_round(root, index, args.mb, client, store) for index in range(args.repeats)]
    finally:
        redis.stop()
        s3.stop()
    print(f"\nshipping a {args.mb:.0f} MB directory at submit ({os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.1f}), {args.repeats} round(s)")
    columns = ["files", "mb", "archive_mb", "pack_s", "tar_s", "upload_s", "submit_s", "beyond_upload_s", "again_s"]
    print(" ".join(f"{c:>15}" for c in columns))
    for row in rows:
        print(" ".join(f"{row[c]:>15.2f}" if isinstance(row[c], float) else f"{row[c]:>15}" for c in columns))
    medians = {c: statistics.median(row[c] for row in rows) for c in columns[3:]}
    print("median " + ", ".join(f"{c} {v:.2f}" for c, v in medians.items()))
    write_result({"mb": args.mb, "repeats": args.repeats, "rows": rows, "median": medians}, args.out)


if __name__ == "__main__":
    main()
