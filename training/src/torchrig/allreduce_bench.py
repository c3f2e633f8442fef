"""all_reduce bandwidth over the cluster, reported the way nccl-tests reports it.

    torchrun --nnodes 2 --nproc-per-node 8 ... -m torchrig.allreduce_bench --json out.json

For each message size: time = mean seconds per all_reduce (the slowest rank's mean),
algbw = bytes / time, busbw = algbw * 2 (n - 1) / n. busbw is the figure to compare with
the link speed: a ring all_reduce moves 2 (n - 1) / n times the message over each link,
so busbw does not depend on the number of ranks n (nccl-tests' performance notes,
https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed

from . import dist
from .config import number

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """'1K' -> 1024, '256M' -> 268435456 (binary units, as nccl-tests' -b/-e)."""
    t = text.strip().upper().removesuffix("B")
    unit = t[-1] if t and t[-1] in _UNITS else ""
    try:
        value = int(t[: len(t) - len(unit)]) * _UNITS[unit]
    except ValueError:
        msg = f"must be a size like 1K, 64M or 1G, got {text!r}"
        raise argparse.ArgumentTypeError(msg) from None
    if value < 4:
        raise argparse.ArgumentTypeError(f"must be at least 4 bytes, got {text!r}")
    return value


def bus_bandwidth(algbw: float, world_size: int) -> float:
    return algbw * 2 * (world_size - 1) / world_size


def message_sizes(min_bytes: int, max_bytes: int) -> list[int]:
    sizes, s = [], min_bytes
    while s <= max_bytes:
        sizes.append(s)
        s *= 2
    return sizes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m torchrig.allreduce_bench",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--min-bytes", type=parse_size, default="1K", help="smallest message")
    p.add_argument("--max-bytes", type=parse_size, default="256M", help="largest message")
    p.add_argument("--iters", type=number(int, 1), default=20, help="timed all_reduces per size")
    p.add_argument("--warmup", type=number(int, 1), default=5, help="untimed all_reduces per size")
    p.add_argument("--json", metavar="FILE", help="also write the results to FILE (rank 0)")
    args = p.parse_args(argv)
    if args.min_bytes > args.max_bytes:
        p.error("argument --min-bytes: must not exceed --max-bytes")

    env = dist.setup()
    sync = torch.cuda.synchronize if env.device.type == "cuda" else (lambda: None)
    rows = []
    try:
        for size in message_sizes(args.min_bytes, args.max_bytes):
            t = torch.ones(size // 4, dtype=torch.float32, device=env.device)
            for _ in range(args.warmup):
                dist.all_reduce_sum(t)
            sync()
            dist.barrier(env)
            t0 = time.perf_counter()
            for _ in range(args.iters):
                dist.all_reduce_sum(t)
            sync()
            elapsed = torch.tensor([(time.perf_counter() - t0) / args.iters], dtype=torch.float64)
            if env.world_size > 1:
                torch.distributed.all_reduce(elapsed, op=torch.distributed.ReduceOp.MAX,
                                             group=env.control_group)
            sec = elapsed.item()
            algbw = size / sec / 1e9
            rows.append({"bytes": size, "time_us": sec * 1e6, "algbw_GBps": algbw,
                         "busbw_GBps": bus_bandwidth(algbw, env.world_size)})
    finally:
        dist.teardown()

    if env.is_main:
        print(f"all_reduce (sum, float32), {env.world_size} ranks, backend "
              f"{env.backend or 'none'}, device {env.device.type}")
        print(f"{'bytes':>12} {'time(us)':>12} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12}")
        for r in rows:
            print(f"{r['bytes']:>12} {r['time_us']:>12.1f} {r['algbw_GBps']:>12.3f} "
                  f"{r['busbw_GBps']:>12.3f}")
        if args.json:
            Path(args.json).write_text(json.dumps(
                {"world_size": env.world_size, "backend": env.backend,
                 "device": env.device.type, "results": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
