"""Faults one machine can inject: a checkpoint writer SIGKILLed mid-write, many times,
and a full disk under the run directory. The cluster faults (a worker or the whole
service killed, a node stopped, provisioning killed) are in the molecule cluster
scenario (molecule/cluster/faults.yml); the list of what is promised and which test
shows it is RELIABILITY.md.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from launch import child_env, train_args
from torchrig import checkpoint
from torchrig.contract import FILES
from torchrig.models import build_model

KILLS = 30


def _save_forever(ckpt_dir: Path, state: dict, first_step: int) -> None:
    """What a rank 0 does at every checkpoint, back to back: save atomically, then prune."""
    step = first_step
    while True:
        step += 1
        state["step"] = step
        checkpoint.save_atomic(state, checkpoint.path_for(ckpt_dir, step))
        checkpoint.prune(ckpt_dir, 3)


def test_sigkill_while_writing_checkpoints_always_leaves_a_loadable_one(tmp_path: Path) -> None:
    ckpt_dir = tmp_path / "checkpoints"
    model = build_model("cnn", 1, 10, 28)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.zeros(2, 1, 28, 28)).sum().backward()
    opt.step()
    # 16 MB more than the CNN's 2.4 MB: writing and fsyncing takes most of the loop's
    # time, so most kills land in the middle of a write.
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 0,
             "pad": torch.arange(4_000_000, dtype=torch.float32)}
    fork = multiprocessing.get_context("fork")  # torch is imported once, in this process
    rng = random.Random(8)
    torn, newest = 0, 0
    for i in range(KILLS):
        # Start again the way the trainer does: stale temp files go, the newest loads.
        checkpoint.remove_stale_temps(ckpt_dir)
        writer = fork.Process(target=_save_forever, args=(ckpt_dir, state, newest), daemon=True)
        writer.start()
        deadline = time.monotonic() + 60
        while not checkpoint.list_steps(ckpt_dir) or checkpoint.list_steps(ckpt_dir)[-1] <= newest:
            assert writer.is_alive(), f"kill {i}: the writer died on its own ({writer.exitcode})"
            assert time.monotonic() < deadline, f"kill {i}: no new checkpoint in 60 s"
            time.sleep(0.005)
        time.sleep(rng.uniform(0, 0.3))
        os.kill(writer.pid, signal.SIGKILL)
        writer.join(30)
        assert writer.exitcode == -signal.SIGKILL

        temps = list(ckpt_dir.glob(".ckpt_*.tmp"))
        torn += bool(temps)
        steps = checkpoint.list_steps(ckpt_dir)
        assert steps, f"kill {i}: no checkpoint left"
        for step in steps:  # every file under a final name is complete
            assert checkpoint.load(checkpoint.path_for(ckpt_dir, step))["step"] == step
        assert steps[-1] > newest, f"kill {i}: the newest checkpoint went back to {steps[-1]}"
        newest = steps[-1]
    # Otherwise the kills missed the writes and this test proved nothing.
    assert torn >= KILLS // 3, f"only {torn} of {KILLS} kills landed during a write"


def _train(run_dir: Path, *extra: str, timeout: float = 300) -> subprocess.CompletedProcess:
    args = train_args(dataset="mnist5k", epochs=1, checkpoint_every=10, keep_checkpoints=3,
                      log_every=10)
    cmd = [sys.executable, "-m", "torchrig.train", *args, *extra, "--run-dir", str(run_dir)]
    return subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=timeout)


def _used_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file())


@pytest.fixture
def small_tmpfs(tmp_path: Path):
    """A tmpfs of its own (root only), sized by the test; unmounted whatever happens."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()

    def mount(size: int) -> Path:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "torchrig-test", str(mnt)],
                       check=True, capture_output=True)
        return mnt

    yield mount
    subprocess.run(["umount", str(mnt)], capture_output=True)


def test_full_disk_at_a_checkpoint_names_the_file_and_keeps_the_previous(
        tmp_path: Path, small_tmpfs) -> None:
    # How much a run writes by its first checkpoint, and how big a checkpoint is.
    probe = tmp_path / "probe"
    assert _train(probe, "--max-steps", "10").returncode == 0
    ckpt_size = checkpoint.path_for(probe / "checkpoints", 10).stat().st_size
    # Room for the outputs and one checkpoint, and half of a second one: the save at
    # step 20 runs out of space (the old checkpoint is pruned only after a new one).
    run_dir = small_tmpfs(_used_bytes(probe) + ckpt_size // 2) / "run"

    full = _train(run_dir, "--max-steps", "30")
    out = full.stdout + full.stderr
    assert full.returncode == 1, out[-3000:]
    second = checkpoint.path_for(run_dir / "checkpoints", 20)
    assert f"cannot write checkpoint {second}: No space left on device (ENOSPC)" in out, out[-3000:]
    assert checkpoint.list_steps(run_dir / "checkpoints") == [10]
    assert checkpoint.load(checkpoint.path_for(run_dir / "checkpoints", 10))["step"] == 10
    assert not [p.name for p in (run_dir / "checkpoints").iterdir() if p.suffix == ".tmp"]

    # Space freed (the tmpfs grown): the same command resumes from the kept checkpoint.
    subprocess.run(["mount", "-o", f"remount,size={4 * _used_bytes(probe) + 8 * ckpt_size}",
                    str(run_dir.parent)], check=True, capture_output=True)
    again = _train(run_dir, "--max-steps", "30")
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert '"resumed_from_step": 10' in (run_dir / FILES["summary"]).read_text()
