"""Helpers that start real torchrun launchers (gloo over loopback) and wait for them.

Every launch has a timeout; waits poll for a condition instead of sleeping a guessed time.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from torchrig.contract import FILES

# A hang guard, not a speed bound: a launch takes 5-15 s here alone, and 10x
# that beside the cluster scenario.
LAUNCH_TIMEOUT = 600

# The configuration every distributed test trains with: 2 ranks x 32 = global batch 64,
# a checkpoint every 50 of the 372 steps, one thread per rank (2 ranks share 2 cores, and
# exact comparisons need the same thread count in every run).
TRAIN = {"dataset": "mnist5k", "model": "cnn", "epochs": 6, "batch-size": 32,
         "checkpoint-every": 50, "keep-checkpoints": 3, "seed": 0, "threads": 1}


def train_args(**overrides) -> list[str]:
    """TRAIN as flags; overrides use underscores: train_args(batch_size=64)."""
    settings = {**TRAIN, **{k.replace("_", "-"): v for k, v in overrides.items()}}
    return [a for k, v in settings.items() for a in (f"--{k}", str(v))]


TRAIN_ARGS = train_args()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    # Without it a restarted group often fails in Gloo's connectFullMesh (the agent's
    # shared store is gone; pytorch#135712); training/README.md, "Tests", has the figures.
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


@dataclass
class Launch:
    proc: subprocess.Popen
    log: Path

    def wait(self, timeout: float = LAUNCH_TIMEOUT) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the launcher and its workers
            self.proc.wait(timeout=30)
            pytest.fail(f"launch timed out after {timeout}s; log:\n{self.output()[-4000:]}")

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def start(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> Launch:
    with log.open("w") as f:  # a file, not a pipe: a full pipe would block the launcher
        # In the log's directory: a worker without a run directory writes its records
        # (its failure record) where it runs.
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=log.parent,
                                env={**child_env(), **(env or {})}, start_new_session=True)
    return Launch(proc, log)


def start_standalone(run_dir: Path, nproc: int = 2, extra: tuple[str, ...] = (),
                     env: dict[str, str] | None = None) -> Launch:
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = torchrun("--standalone", f"--nproc-per-node={nproc}", *extra, "-m", "torchrig.train",
                   *TRAIN_ARGS, "--run-dir", str(run_dir))
    return start(cmd, run_dir.parent / f"{run_dir.name}.log", env)


def hold_after_checkpoint(step: int, go: Path) -> dict[str, str]:
    """The environment that holds rank 0 after its checkpoint of `step` until `go` exists
    (hold/sitecustomize.py): a fault injected meanwhile lands mid-run, however slow the test."""
    hold = str(Path(__file__).parent / "hold")
    return {"PYTHONPATH": os.pathsep.join(filter(None, [hold, os.environ.get("PYTHONPATH")])),
            "TORCHRIG_TEST_HOLD_STEP": str(step), "TORCHRIG_TEST_HOLD_GO": str(go)}


def start_two_nodes(run_dirs: list[Path], run_id: str, *extra: str,
                    env: dict[str, str] | None = None) -> list[Launch]:
    """Two launchers, one process each, meeting at a c10d rendezvous on loopback."""
    port = free_port()
    launches = []
    for d in run_dirs:
        d.mkdir(parents=True, exist_ok=True)
        cmd = torchrun("--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                       f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={run_id}",
                       "-m", "torchrig.train", *TRAIN_ARGS, *extra, "--run-dir", str(d))
        launches.append(start(cmd, d.parent / f"{d.name}.log", env))
    return launches


def wait_for(condition, what: str, launches: list[Launch], timeout: float = LAUNCH_TIMEOUT):
    """Poll `condition` until true; fail early, with the logs, if a launcher has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (value := condition()):
            return value
        if any(la.proc.poll() is not None for la in launches):
            logs = "\n".join(la.output()[-3000:] for la in launches)
            pytest.fail(f"a launcher exited while waiting for {what}:\n{logs}")
        time.sleep(0.02)
    pytest.fail(f"timed out waiting for {what}")


def read_summary(*run_dirs: Path) -> dict:
    """The summary of the run: rank 0 writes it on whichever node it landed."""
    found = [d / FILES["summary"] for d in run_dirs if (d / FILES["summary"]).exists()]
    assert len(found) == 1, f"expected one {FILES['summary']} in {run_dirs}, found {found}"
    return json.loads(found[0].read_text())


def eval_records(run_dir: Path) -> list[dict]:
    lines = (run_dir / FILES["metrics"]).read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["split"] == "eval"]
