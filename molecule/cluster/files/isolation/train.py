"""Two jobs side by side, for molecule/cluster/tasks/isolation.yml: a target that trains
(gloo all-reduces) until told to stop, and an intruder that tries the target from its own
job, on every node, and writes what each try gave.

    train.py target                      every rank writes its step to <run dir>/progress
                                         on its node; all stop once <run dir>/stop exists
                                         on any node (or after 600 s)
    train.py intruder JOB HOST:PORT      tries job JOB (its env file, code, run directory,
                                         processes) and its rendezvous store at
                                         HOST:PORT, then the node's memory and process
                                         table past its own unit's limits; writes
                                         TORCHRIG_OUTPUT_DIR/attacks.json and leaves links
                                         there to root-only files
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

CONFIG_DIR = Path("/etc/torchrig/jobs")
CODE_ROOT = Path("/var/lib/torchrig/code")
RUN_ROOT = Path("/var/lib/torchrig/runs")


def target() -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    run_dir = Path(os.environ["TORCHRIG_RUN_DIR"])
    started = time.monotonic()
    step = 0
    while True:
        stop = float((run_dir / "stop").exists() or time.monotonic() - started > 600)
        flag = torch.tensor([stop])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() > 0:
            break
        step += 1
        (run_dir / "progress.tmp").write_text(f"{step}\n")
        (run_dir / "progress.tmp").replace(run_dir / "progress")
        time.sleep(0.2)
    dist.destroy_process_group()


def attempt(action) -> str:
    """'done: ...' when the try worked, else the error's class name."""
    try:
        return f"done: {action()}"[:200]
    except OSError as error:
        return type(error).__name__


def connect(endpoint: str) -> str:
    host, port = endpoint.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5):
        return "connected"


def processes_of(job: str) -> list[int]:
    """Processes whose command line names job JOB (its torchrun and workers), as far as
    /proc shows them to this user."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if f"--rdzv-id={job}" in cmdline or f"/{job}/" in cmdline:
                found.append(int(entry.name))
    return found


def eat_memory(mib: int) -> str:
    """How a child that asks for `mib` MiB ends: the kernel must end it at the unit's MemoryMax."""
    pid = os.fork()
    if pid == 0:
        # This child, not torchrun's agent beside it, is the one the kernel ends.
        Path("/proc/self/oom_score_adj").write_text("1000\n")
        chunks = [b"\x01" * (1 << 20) for _ in range(mib)]  # written, so resident
        os._exit(0 if len(chunks) == mib else 1)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return signal.Signals(os.WTERMSIG(status)).name
    return f"exit {os.WEXITSTATUS(status)}"


def start_threads(count: int) -> int:
    """How many of `count` threads start: the unit's TasksMax must stop them first."""
    release = threading.Event()
    started = 0
    try:
        for _ in range(count):
            threading.Thread(target=release.wait, daemon=True).start()
            started += 1
    except RuntimeError:  # "can't start new thread": the process table is closed to this job
        pass
    release.set()
    return started


def intruder(job: str, endpoint: str) -> None:
    pids = processes_of(job)
    result = {
        "node": socket.gethostname(),
        "uid": os.getuid(),
        "env_file": attempt((CONFIG_DIR / f"{job}.env").read_text),
        "code": attempt((CODE_ROOT / job / "train.py").read_text),
        "run_dir": attempt(lambda: sorted(os.listdir(RUN_ROOT / job))),
        "progress": attempt((RUN_ROOT / job / "progress").read_text),
        "jobs_listed": attempt(lambda: sorted(os.listdir(RUN_ROOT))),
        "processes": pids,
        # Signal 0 asks whether a signal would be delivered, without sending one; then a real SIGTERM.
        "signal_0": [attempt(lambda pid=pid: os.kill(pid, 0)) for pid in pids],
        "sigterm": [attempt(lambda pid=pid: os.kill(pid, signal.SIGTERM)) for pid in pids],
        "store": attempt(lambda: connect(endpoint)),
        # Past the limits isolation.yml gives this job (torchrun_memory_max, torchrun_tasks_max).
        "memory_1g": eat_memory(1024),
        "threads_of_400": start_threads(400),
    }
    out = Path(os.environ["TORCHRIG_OUTPUT_DIR"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "attacks.json").write_text(json.dumps(result, indent=1) + "\n")
    # Left for train.yml's fetch: links to root-only files and to the target's run
    # directory. None of them may bring anything home (isolation.yml checks).
    for name, where in (("shadow", "/etc/shadow"), ("hostkey", "/etc/ssh/ssh_host_ed25519_key"),
                        ("root", "/root"), ("target", str(RUN_ROOT / job))):
        (out / f"link-{name}").symlink_to(where)
    print("intruder:", json.dumps(result), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["target"]:
        target()
    elif sys.argv[1:2] == ["intruder"] and len(sys.argv) == 4:
        intruder(sys.argv[2], sys.argv[3])
    else:
        sys.exit(f"usage: {sys.argv[0]} target | intruder JOB HOST:PORT")
