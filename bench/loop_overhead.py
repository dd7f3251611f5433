"""What ``baton run`` costs per epoch against a bare PyTorch loop doing the same work.

The job is examples/spiral.yaml's shape (2-128-3 MLP with dropout, 3,000 spiral points split
80/20, batch 64, AdamW, OneCycle, clipping at 1.0, deterministic kernels), with no mid-epoch
checkpoints. The bare loop is what a careful user would write by hand for it: the same model,
data, optimizer, schedule and clipping, ``loss.item()`` logged per batch, validation in eval mode
with loss and accuracy averaged per sample, and ``torch.save`` of the weights when the validation
loss improves; its DataLoader loads a Subset sample by sample and collates. A second bare loop,
``bare-gathered``, does the same with batches gathered by indexing the data's tensors, as baton's
loader does for a TensorDataset: baton against it is the loop's own overhead, the data path left
out. baton does more per epoch by contract (a full-state checkpoint committed to the
store with its metrics, TensorBoard rows), and that is part of what is measured.

All run as separate processes (``python -m baton run`` and this file's ``--bare``) for a short
and a long number of epochs, interleaved; the per-epoch time is the slope between the two, so
start-up (imports, the report, the final artifacts) cancels. A second figure, steadier, is the
median time between consecutive "epoch N" lines of each long run after its first 20 epochs (a
slope carries the start-up's variance, one second of which moves it by 8 ms at 5/125 epochs).

    python bench/loop_overhead.py [--short 5] [--long 125] [--repeats 3] [--threads 1] [--max-ratio 1.10]
    python bench/loop_overhead.py --device cuda    # both loops on the GPU, batches moved there per step

It exits 1, saying so, when baton's steady-state epoch costs more than ``--max-ratio`` times the bare
loop's (a change that costs more than 10 % an epoch fails it loudly).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SPEC = ROOT / "examples" / "spiral.yaml"
KINDS = ("bare", "bare-gathered", "baton")
"""``bare-gathered`` takes its batches as baton's loader does for a TensorDataset (one indexing of
each tensor), so baton against it is the loop's own overhead with the data path left out."""


def bare_loop(epochs: int, threads: int, out_dir: Path, gathered: bool = False, device: str = "cpu") -> float:
    """The hand-written loop; returns the best validation loss. ``gathered``: batches are taken by
    indexing the data set's tensors (as baton's loader does for a TensorDataset) instead of a
    DataLoader's per-sample ``__getitem__`` and collate, which isolates the loop's own overhead."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, Subset

    from baton.workers.training.builtins.data import spiral

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS, as baton sets it
    torch.manual_seed(1234)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(threads)
    data = spiral(seed=1234, n_per_class=1000)
    perm = torch.randperm(len(data), generator=torch.Generator().manual_seed(1234)).tolist()
    n_val = int(0.2 * len(data))
    train, val = Subset(data, perm[n_val:]), Subset(data, perm[:n_val])
    if gathered:
        train_loader, val_loader = Gathered(data.tensors, perm[n_val:], 64, shuffle=True), Gathered(data.tensors, perm[:n_val], 64)
    else:
        train_loader = DataLoader(train, batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(1))
        val_loader = DataLoader(val, batch_size=64)
    model = nn.Sequential(nn.Linear(2, 128), nn.ReLU(), nn.Dropout(0.1), nn.Linear(128, 128), nn.ReLU(),
                          nn.Dropout(0.1), nn.Linear(128, 3)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=epochs * len(train_loader),
                                                    pct_start=0.1)
    best = float("inf")
    for epoch in range(epochs):
        model.train()
        loss_sum, seen = 0.0, 0
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            loss_sum += loss.item() * len(y)
            seen += len(y)
        model.eval()
        val_sum, correct, n = 0.0, 0, 0
        with torch.no_grad():
            for x, y in val_loader:
                x, y = x.to(device), y.to(device)
                logits = model(x)
                val_sum += nn.functional.cross_entropy(logits, y, reduction="sum").item()
                correct += (logits.argmax(1) == y).sum().item()
                n += len(y)
        val_loss = val_sum / n
        if val_loss < best:
            best = val_loss
            torch.save(model.state_dict(), out_dir / "best.pt")
        print(f"epoch {epoch}: train_loss {loss_sum / seen:.4f} val_loss {val_loss:.4f} val_accuracy {correct / n:.4f}",
              flush=True)
    return best


class Gathered:
    """Batches of a TensorDataset's rows by one indexing of each tensor, optionally reshuffled each
    pass. It draws what the bare loop's DataLoader draws (an iterator's base seed from the loader's
    generator, or from the global RNG when it has none, then the shuffle and RandomSampler's extra
    permutation), so both bare loops train bit for bit alike."""

    def __init__(self, tensors, indices: list[int], batch_size: int, shuffle: bool = False):
        import torch

        self.tensors, self.indices, self.batch_size, self.shuffle = tensors, torch.tensor(indices), batch_size, shuffle
        self.generator = torch.Generator().manual_seed(1) if shuffle else None

    def __len__(self) -> int:
        return -(-len(self.indices) // self.batch_size)

    def __iter__(self):
        import torch

        torch.empty((), dtype=torch.int64).random_(generator=self.generator)  # the iterator's base seed
        order = self.indices[torch.randperm(len(self.indices), generator=self.generator)] if self.shuffle else self.indices
        for start in range(0, len(order), self.batch_size):
            index = order[start:start + self.batch_size]
            yield [t[index] for t in self.tensors]
        if self.shuffle:  # RandomSampler draws a last (empty) slice of a permutation after a whole pass
            torch.randperm(len(self.indices), generator=self.generator)


def run_timed(cmd: list[str], env: dict) -> tuple[float, list[float]]:
    """Wall time of the whole process, and when each of its "epoch N: ..." lines arrived."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT, text=True)
    stamps = [time.perf_counter() for line in proc.stdout if line.startswith("epoch ")]
    if proc.wait():
        raise subprocess.CalledProcessError(proc.returncode, cmd)
    return time.perf_counter() - started, stamps


def steady_epoch(stamps: list[float], skip: int = 20) -> float:
    """The median time between consecutive epochs' lines, after the first ``skip`` epochs."""
    gaps = [b - a for a, b in zip(stamps, stamps[1:])][skip:]
    return statistics.median(gaps) if gaps else float("nan")


def bare_command(kind: str, epochs: int, threads: int, work: Path, device: str = "cpu") -> list[str]:
    """The bare loop (``bare`` or ``bare-gathered``) in a process of its own, saving into ``work``."""
    return [sys.executable, str(Path(__file__).resolve()), "--bare", str(epochs), "--threads", str(threads),
            "--work", str(work), "--device", device] + (["--gathered"] if kind == "bare-gathered" else [])


def write_result(result: dict, out: str) -> None:
    """The bench's JSON, with the machine it ran on, at ``out`` (relative to the repository)."""
    result["machine"] = {"cpus": os.cpu_count(), "load_avg_1m": os.getloadavg()[0], "python": platform.python_version()}
    if result.get("device") == "cuda":
        import torch

        result["machine"].update(gpu=torch.cuda.get_device_name(), torch=torch.__version__)
    path = ROOT / out if not Path(out).is_absolute() else Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    print(f"wrote {path}")


def command(kind: str, epochs: int, threads: int, work: Path, run_id: str, device: str = "cpu") -> list[str]:
    if kind in ("bare", "bare-gathered"):
        return bare_command(kind, epochs, threads, work / run_id, device)
    return [sys.executable, "-m", "baton", "run", str(SPEC), "--id", run_id, "--storage", f"file://{work / 'store'}",
            "--no-progress", "--set", f"loop.epochs={epochs}", "--set", "checkpoint.every_steps=null",
            "--set", f"resources.cpu_threads={threads}", "--set", f"resources.device={device}"]


def measure(short: int, long: int, repeats: int, threads: int, device: str = "cpu") -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    times: dict[tuple[str, int], list[float]] = {(k, e): [] for k in KINDS for e in (short, long)}
    steady: dict[str, list[float]] = {k: [] for k in KINDS}
    with tempfile.TemporaryDirectory(prefix="baton-loop-bench-") as tmp:
        work = Path(tmp)
        for r in range(repeats):
            order = [(k, e) for e in (short, long) for k in KINDS]
            if r % 2:
                order.reverse()  # alternate, so a drift in the machine's load hits both sides alike
            for kind, epochs in order:
                run_id = f"{kind}-{epochs}-{r}"
                (work / run_id).mkdir()
                elapsed, stamps = run_timed(command(kind, epochs, threads, work, run_id, device), env)
                times[(kind, epochs)].append(elapsed)
                if epochs == long:
                    steady[kind].append(steady_epoch(stamps))
                print(f"  repeat {r}: {kind:>13} {epochs:>3} epochs {elapsed:6.2f} s", flush=True)
    per_epoch = {}
    for kind in KINDS:
        slopes = [(lt - st) / (long - short) for st, lt in zip(times[(kind, short)], times[(kind, long)])]
        per_epoch[kind] = {"slopes_s": slopes, "per_epoch_s": statistics.median(slopes),
                           "short_s": times[(kind, short)], "long_s": times[(kind, long)]}
        per_epoch[kind]["steady_s"] = steady[kind]
        per_epoch[kind]["steady_median_s"] = statistics.median(steady[kind])
    pair_ratios = [b / a for b, a in zip(per_epoch["baton"]["slopes_s"], per_epoch["bare"]["slopes_s"])]
    gathered = per_epoch["bare-gathered"]
    return {"short_epochs": short, "long_epochs": long, "repeats": repeats, "threads": threads, "device": device,
            "per_epoch": per_epoch, "ratio": per_epoch["baton"]["per_epoch_s"] / per_epoch["bare"]["per_epoch_s"],
            "pair_ratios": pair_ratios,
            "steady_ratio": per_epoch["baton"]["steady_median_s"] / per_epoch["bare"]["steady_median_s"],
            "ratio_vs_gathered": per_epoch["baton"]["per_epoch_s"] / gathered["per_epoch_s"],
            "steady_ratio_vs_gathered": per_epoch["baton"]["steady_median_s"] / gathered["steady_median_s"]}


def print_table(result: dict) -> None:
    print(f"\nper-epoch time from the slope between {result['short_epochs']} and {result['long_epochs']} epochs, "
          f"median of {result['repeats']} interleaved repeats, {result['threads']} torch thread(s), "
          f"device {result.get('device', 'cpu')}")
    print(f"{'loop':>13} {'per epoch ms':>13} {'slopes ms':>24}")
    for kind in KINDS:
        r = result["per_epoch"][kind]
        slopes = " ".join(f"{s * 1e3:.0f}" for s in r["slopes_s"])
        print(f"{kind:>13} {r['per_epoch_s'] * 1e3:>13.1f} {slopes:>24}")
    pairs = " ".join(f"{x:.2f}" for x in result["pair_ratios"])
    print(f"baton / bare: {result['ratio']:.2f}x (per repeat: {pairs}); "
          f"baton / bare-gathered: {result['ratio_vs_gathered']:.2f}x")
    print("\nsteady state: median time between epochs after the first 20 of each long run "
          "(start-up and its noise left out)")
    for kind in KINDS:
        r = result["per_epoch"][kind]
        runs = " ".join(f"{s * 1e3:.1f}" for s in r["steady_s"])
        print(f"{kind:>13} {r['steady_median_s'] * 1e3:>13.1f} {runs:>24}")
    print(f"baton / bare: {result['steady_ratio']:.2f}x; baton / bare-gathered: {result['steady_ratio_vs_gathered']:.2f}x")


MAX_RATIO = 1.10
"""The most ``baton run``'s steady-state epoch may cost against the bare loop's before this bench fails."""


def verdict(result: dict, max_ratio: float) -> "str | None":
    """Why the result fails (baton's steady-state epoch over ``max_ratio`` times the bare loop's), or None."""
    ratio = result["steady_ratio"]
    if max_ratio <= 0 or ratio <= max_ratio:
        return None
    return (f"FAIL: baton run's epoch costs {ratio:.2f}x the bare loop's in the steady state (at most "
            f"{max_ratio:.2f}x allowed): find where it went with bench/loop_ablation.py --threads "
            f"{result['threads']} (measured on a quiet machine? a neighbour's load can do this too)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--short", type=int, default=5)
    parser.add_argument("--long", type=int, default=125)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads, both loops")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where both loops train")
    parser.add_argument("--out", default=None, help="default bench/results/loop_overhead[_cuda].json")
    parser.add_argument("--max-ratio", type=float, default=MAX_RATIO,
                        help="exit 1 when baton's steady-state epoch exceeds this many times the bare loop's (0: never)")
    parser.add_argument("--bare", type=int, help=argparse.SUPPRESS)  # internal: run the bare loop for N epochs
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--gathered", action="store_true", help=argparse.SUPPRESS)  # internal: the bare loop's batches gathered
    args = parser.parse_args()
    if args.bare is not None:
        bare_loop(args.bare, args.threads, Path(args.work), args.gathered, args.device)
        return
    args.out = args.out or f"bench/results/loop_overhead{'_cuda' if args.device == 'cuda' else ''}.json"
    result = measure(args.short, args.long, args.repeats, args.threads, args.device)
    print_table(result)
    write_result(result, args.out)
    failed = verdict(result, args.max_ratio)
    if failed:
        print(failed, file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
