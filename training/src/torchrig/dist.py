"""Process-group set-up for torchrun (or one plain process) and the few collectives we need.

All helpers also work when no process group exists (world size 1), so the training loop
has one code path.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from torchrig.contract import ENV


@dataclass
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    device: torch.device
    backend: str | None  # None: single process, no process group
    threads: int
    hostname: str
    # A CPU (gloo) group of its own for small control messages: a per-step stop vote then
    # neither synchronises the GPU stream nor queues behind DDP's gradient all-reduces.
    control_group: Any = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def launched_by_torchrun() -> bool:
    """torchrun (torch.distributed.run) sets TORCHELASTIC_RUN_ID for every worker."""
    return "TORCHELASTIC_RUN_ID" in os.environ and "MASTER_ADDR" in os.environ


def pg_timeout() -> timedelta | None:
    """The job's pg_timeout (ENV["pg_timeout"]) in seconds, or None for torch's default
    (10 min NCCL, 30 gloo).

    It bounds how long the ranks wait in a collective for a node that died without a
    word (power loss, kernel panic): then the worker fails, torchrun goes back to
    rendezvous, and the job waits there for the node to return (job unit, join_timeout).
    """
    value = os.environ.get(ENV["pg_timeout"], "")
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"{ENV['pg_timeout']} must be seconds, got {value!r}") from None
    if seconds <= 0:
        raise ValueError(f"{ENV['pg_timeout']} must be above 0 seconds, got {value!r}")
    return timedelta(seconds=seconds)


class DeviceError(Exception):
    """A node set up so that the job cannot run as asked (more processes than GPUs)."""


def gpu_index(local_rank: int, local_world_size: int, device_count: int) -> int:
    """This process's GPU: its local rank, one GPU per process.

    More processes on a node than GPUs is an error: `local_rank % device_count` would put
    two ranks on one GPU, where NCCL fails or hangs ("Duplicate GPU detected") and the
    memory of both is one GPU's.
    """
    if local_world_size > device_count:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        where = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
        raise DeviceError(
            f"this node runs {local_world_size} processes (torchrun --nproc-per-node, "
            f"LOCAL_WORLD_SIZE) but {device_count} GPU(s) are visible{where}: two processes "
            f"would share a GPU. Needs: --nproc-per-node {device_count} or fewer "
            f"(torchrun_nproc_per_node: 0 runs one per GPU)")
    return local_rank


def make_deterministic() -> None:
    """Same inputs, same bits on a GPU too: deterministic kernels only, no autotuning.

    Call before the first CUDA matrix product: cuBLAS reads CUBLAS_WORKSPACE_CONFIG when
    it makes its handle. An op with no deterministic implementation warns, naming itself
    (warn_only), rather than ending the run; such a run is then not bit-exact.
    """
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True


def use_cuda(backend: str, cuda_available: bool) -> bool:
    """Whether this process trains on a GPU. ENV['backend'] is the job's one backend,
    decided by train.yml across its hosts: gloo keeps a host with GPUs on its CPU, and
    nccl on a host whose CUDA does not work fails here, by name, not at a collective."""
    if backend == "gloo":
        return False
    if backend == "nccl" and not cuda_available:
        raise RuntimeError(f"the job runs nccl, but CUDA is not available on "
                           f"{socket.gethostname()} (torch.cuda.is_available() is False): check "
                           "its driver (health.yml), "
                           "or add the host to the CPU group")
    if backend not in ("", "nccl"):
        raise ValueError(f"{ENV['backend']} must be nccl or gloo, got {backend!r}")
    return cuda_available


def setup(threads: int = 0) -> DistEnv:
    """Read torchrun's environment, pick the device and backend, set the thread count."""
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    # torchrun forces OMP_NUM_THREADS=1 when it starts several processes per node; on a
    # CPU node that leaves cores idle, so set the count explicitly.
    if threads <= 0:
        threads = max(1, usable_cores() // local_world_size)
    torch.set_num_threads(threads)

    if use_cuda(os.environ.get(ENV["backend"], ""), torch.cuda.is_available()):
        device = torch.device("cuda", gpu_index(local_rank, local_world_size,
                                                torch.cuda.device_count()))
        torch.cuda.set_device(device)
        # Fixed input shapes: let cuDNN time its kernels and keep the fastest, unless the
        # run must be deterministic (the choice can differ between runs).
        torch.backends.cudnn.benchmark = not torch.are_deterministic_algorithms_enabled()
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    env = DistEnv(rank, local_rank, world_size, local_world_size, device, None, threads,
                  socket.gethostname())
    # Under torchrun a group is made even for one process, so a 1-GPU job runs the same
    # NCCL path as a larger one (measured on an H200: without it allreduce_bench timed no
    # collective at all). A plain `python -m torchrig.train` stays group-free.
    if world_size > 1 or launched_by_torchrun():
        timeout = pg_timeout()
        if backend == "nccl":
            dist.init_process_group("nccl", device_id=device, timeout=timeout)
        else:
            dist.init_process_group("gloo", timeout=timeout)
        env.control_group = dist.new_group(backend="gloo", timeout=timeout)
        env.backend = backend
    return env


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def any_rank(flag: bool, env: DistEnv) -> bool:
    """True on every rank if `flag` is true on any rank (so all ranks act at the same step)."""
    if not dist.is_initialized():
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=env.control_group)
    return bool(t.item())


def all_reduce_async_max(t: torch.Tensor, env: DistEnv):
    """Start a MAX all_reduce of a CPU tensor on the control group; returns its Work."""
    return dist.all_reduce(t, op=dist.ReduceOp.MAX, group=env.control_group, async_op=True)


def all_ranks(flag: bool, env: DistEnv) -> bool:
    """True on every rank only if `flag` is true on every rank."""
    return not any_rank(not flag, env)


def all_gather_object(obj: Any, env: DistEnv) -> list[Any]:
    if not dist.is_initialized():
        return [obj]
    out: list[Any] = [None] * env.world_size
    dist.all_gather_object(out, obj, group=env.control_group)
    return out


def barrier(env: DistEnv) -> None:
    if dist.is_initialized():
        dist.barrier(group=env.control_group)
