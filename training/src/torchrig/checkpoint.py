"""Atomic, node-local checkpoints and the agreement on which one to resume from.

No shared storage is assumed. Every node's local rank 0 writes the same checkpoint into
its own --run-dir/checkpoints (DDP keeps the model identical on every rank, so each copy
is valid). Under c10d, ranks follow join order and can change across restarts, so at
start every rank lists its node's checkpoints, the lists are gathered, and all ranks take
the newest step that every node has and that loads on every node. An unreadable file
(e.g. truncated by a crash) is skipped with a warning and the next older common step is
tried. Only when no common step loads everywhere is a copy sent from a node that has one.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import re
import socket
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed

from . import dist
from .dist import DistEnv

log = logging.getLogger("torchrig")

_NAME = re.compile(r"^ckpt_(\d+)\.pt$")


def path_for(ckpt_dir: Path, step: int) -> Path:
    return ckpt_dir / f"ckpt_{step:08d}.pt"


def list_steps(ckpt_dir: Path) -> list[int]:
    """Steps of the finished checkpoint files in `ckpt_dir`, oldest first."""
    if not ckpt_dir.is_dir():
        return []
    return sorted(int(m.group(1)) for p in ckpt_dir.iterdir() if (m := _NAME.match(p.name)))


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_atomic(obj: Any, path: Path) -> None:
    """Write `obj` so that `path` is either absent, the old file, or the complete new one.

    The temp file is in the same directory (os.replace is atomic only within a file
    system), is fsynced before the rename, and the directory is fsynced after it so the
    rename itself survives a power loss. The name is unique per host and process, so two
    nodes that do share the directory never write the same temp file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        code = _os_errno(e)
        if code is None:
            raise
        # torch.save turns a failed write (a full disk) into "RuntimeError: ...
        # unexpected pos N vs M", naming neither the file nor the cause.
        msg = (f"cannot write checkpoint {path}: {os.strerror(code)} "
               f"({errno.errorcode.get(code, code)}); the temp file was removed and the "
               f"earlier checkpoints in {path.parent} are kept")
        log.error("%s", msg)
        raise OSError(code, msg) from e
    _fsync_dir(path.parent)


def _os_errno(e: BaseException | None) -> int | None:
    """The errno of the OSError behind `e` (itself or what it was raised from)."""
    seen = 0
    while e is not None and seen < 10:
        if isinstance(e, OSError) and e.errno is not None:
            return e.errno
        e, seen = e.__cause__ or e.__context__, seen + 1
    return None


def prune(ckpt_dir: Path, keep: int, newest: int | None = None) -> None:
    """Keep the `keep` newest checkpoints up to `newest`, the step this run just wrote.

    `newest` is the one the next resume needs: every node has just written it. Files of
    later steps belong to a run this one replaced (started with --no-resume, or resumed
    from an older step than one node held); counted, they pushed the new checkpoint out
    at once, and a resume then went back to that other run. So they go instead.
    """
    steps = list_steps(ckpt_dir)
    if newest is None:
        newest = steps[-1] if steps else 0
    older = [s for s in steps if s <= newest]
    for step in [s for s in steps if s > newest] + older[:-keep]:
        path_for(ckpt_dir, step).unlink(missing_ok=True)  # another node may share the dir


def remove_stale_temps(ckpt_dir: Path) -> None:
    """Temp files left by a process killed while saving: never valid, so delete them."""
    if ckpt_dir.is_dir():
        for p in ckpt_dir.glob(".ckpt_*.tmp"):
            p.unlink(missing_ok=True)


def load(path: Path) -> dict[str, Any]:
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or "model" not in state or "step" not in state:
        raise ValueError("not a torchrig checkpoint")
    return state


def _try_load(ckpt_dir: Path, step: int, env: DistEnv) -> dict[str, Any] | None:
    path = path_for(ckpt_dir, step)
    try:
        state = load(path)
        if state["step"] != step:
            raise ValueError(f"it holds step {state['step']}")
        return state
    except Exception as e:
        log.warning("rank %d: checkpoint %s is unreadable (%s: %s); falling back",
                    env.rank, path, type(e).__name__, e)
        return None


def agree_on_resume(ckpt_dir: Path, env: DistEnv) -> tuple[int | None, dict[str, Any] | None]:
    """The step to resume from and its state, the same on every rank; (None, None) if none.

    First choice: the newest step that every node has and can load (no data moves).
    Failing that, e.g. a node joined with an empty disk, the newest step some node can
    load is sent from there to all ranks, rather than losing the progress.
    """
    per_rank = dist.all_gather_object(list_steps(ckpt_dir), env)
    common = set(per_rank[0]).intersection(*per_rank[1:])
    for step in sorted(common, reverse=True):
        state = _try_load(ckpt_dir, step, env)
        if dist.all_ranks(state is not None, env):
            return step, state
        if state is not None:
            log.warning("rank %d: checkpoint step %d is unreadable on another node; falling "
                        "back", env.rank, step)
    for step in sorted(set().union(*per_rank), reverse=True):
        state = _try_load(ckpt_dir, step, env) if step in per_rank[env.rank] else None
        readable = dist.all_gather_object(state is not None, env)
        if any(readable):
            src = readable.index(True)
            if env.world_size > 1:
                box = [state if env.rank == src else None]
                torch.distributed.broadcast_object_list(box, src=src, group=env.control_group)
                state = box[0]
            if env.is_main:
                log.warning("no checkpoint is readable on every node (steps per rank: %s); "
                            "resuming from step %d, sent from rank %d", per_rank, step, src)
            return step, state
    if any(per_rank) and env.is_main:
        log.warning("no checkpoint is readable (steps per rank: %s); starting from scratch",
                    per_rank)
    return None, None


def rng_state(device: torch.device) -> dict[str, Any]:
    # numpy's state holds an ndarray, which torch.load(weights_only=True) refuses: store
    # its parts as a tensor and plain numbers.
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
        "torch": torch.get_rng_state(),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    random.setstate(state["python"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
