"""Throughput of torchrig-train against a tutorial-style DDP loop, and its weak scaling.

    .venv/bin/python bench/bench_trainer.py            # a few minutes on 2 CPU cores

1. Trainer vs reference, same model (torchrig's small CNN), data (mnist5k), per-process
   batch, thread count and process count. The reference is written the way the usual
   DDP tutorial is: a DataLoader over a TensorDataset with a DistributedSampler, `.to()`
   per batch, `loss.item()` every step, no schedule, no checkpoints. Both are timed over
   the training loop only (no start-up, no evaluation). Target: ratio >= 1.0.
2. Weak scaling of the trainer: N processes of one thread each (one core = one "device")
   against 1 process of one thread, per-process batch fixed:
   efficiency = samples/s(N) / (N x samples/s(1)).

Every measurement is a fresh process (or torchrun launch); each is run --repeats times,
the runs being compared alternate, and the best of each is kept: a small VM is noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from torchrig.contract import FILES
from torchrig.data import load_mnist5k
from torchrig.models import SmallCNN


def reference_worker(args: argparse.Namespace) -> None:
    """The tutorial-style loop; runs under torchrun or as one process."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    torch.set_num_threads(args.threads)
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) \
        if torch.cuda.is_available() else torch.device("cpu")
    if world > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    torch.manual_seed(0)
    d = load_mnist5k()
    dataset = TensorDataset(d.train_x, d.train_y)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    model = SmallCNN(1, 10, 28).to(device)
    if world > 1:
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    samples, t0 = 0, time.perf_counter()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for xb, yb in loader:
            x, y = xb.to(device), yb.to(device)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            samples += len(y) * world
            if rank == 0 and samples % (100 * len(y) * world) == 0:
                print(f"epoch {epoch} loss {loss.item():.4f}")
            loss.item()  # the tutorial's running-loss bookkeeping: a host sync per step
    elapsed = time.perf_counter() - t0
    if rank == 0:
        Path(args.out).write_text(json.dumps({"samples_per_s": samples / elapsed}))
    if world > 1:
        dist.destroy_process_group()


def launch(nproc: int, module_args: list[str], env: dict[str, str]) -> None:
    if nproc == 1:
        cmd = [sys.executable, *module_args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}", *module_args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    if proc.returncode != 0:
        sys.exit(f"failed: {shlex.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def trainer(tmp: Path, nproc: int, threads: int, args, env) -> float:
    run_dir = tmp / f"trainer-{nproc}-{threads}-{time.monotonic_ns()}"
    launch(nproc, ["-m", "torchrig.train", "--dataset", "mnist5k", "--epochs", str(args.epochs),
                   "--batch-size", str(args.batch_size), "--threads", str(threads),
                   "--checkpoint-every", "0", "--run-dir", str(run_dir),
                   *shlex.split(args.trainer_flags)], env)
    return json.loads((run_dir / FILES["summary"]).read_text())["samples_per_s"]


def reference(tmp: Path, nproc: int, threads: int, args, env) -> float:
    out = tmp / f"reference-{nproc}-{threads}-{time.monotonic_ns()}.json"
    launch(nproc, [__file__, "--reference-worker", "--out", str(out), "--threads", str(threads),
                   "--epochs", str(args.epochs), "--batch-size", str(args.batch_size)], env)
    return json.loads(out.read_text())["samples_per_s"]


def best_of_interleaved(repeats: int, *runs) -> list[float]:
    """Best of `repeats` for each run, alternating runs so both see the same machine load."""
    results = [[] for _ in runs]
    for _ in range(repeats):
        for out, run in zip(results, runs, strict=True):
            out.append(run())
    return [max(r) for r in results]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32, help="per process")
    p.add_argument("--nproc", type=int, default=2, help="processes for the multi-process runs")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--trainer-flags", default="",
                   help="extra torchrig-train flags, e.g. '--precision bf16 --channels-last "
                   "--compile' on a GPU")
    p.add_argument("--reference-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.reference_worker:
        reference_worker(args)
        return

    cores = len(os.sched_getaffinity(0))
    env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    print(f"{cores} cores, mnist5k, small CNN, batch {args.batch_size}/process, "
          f"{args.epochs} epochs, best of {args.repeats}; trainer flags: "
          f"{args.trainer_flags or '(none)'}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-trainer-") as t:
        tmp = Path(t)
        rows = []
        for nproc in (1, args.nproc):
            threads = max(1, cores // nproc)
            ref, ours = best_of_interleaved(
                args.repeats, lambda n=nproc, t=threads: reference(tmp, n, t, args, env),
                lambda n=nproc, t=threads: trainer(tmp, n, t, args, env))
            rows.append((nproc, threads, ref, ours))
            print(f"{nproc} process(es) x {threads} thread(s): reference {ref:8.0f} samples/s, "
                  f"torchrig {ours:8.0f} samples/s, ratio {ours / ref:.2f}", flush=True)
        one, many = best_of_interleaved(
            args.repeats, lambda: trainer(tmp, 1, 1, args, env),
            lambda: trainer(tmp, args.nproc, 1, args, env))
        eff = many / (args.nproc * one)
        print(f"weak scaling, 1 thread/process: 1 process {one:.0f} samples/s, {args.nproc} "
              f"processes {many:.0f} samples/s, efficiency {eff:.2f}")
    print("\nsummary")
    for nproc, threads, ref, ours in rows:
        print(f"  trainer/reference ratio, {nproc} proc x {threads} thr: {ours / ref:.2f}")
    print(f"  weak-scaling efficiency, {args.nproc} vs 1 process: {eff:.2f}")


if __name__ == "__main__":
    main()
