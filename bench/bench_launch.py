#!/usr/bin/env python3
"""Launch latency: from `ansible-playbook train.yml` to the first training step on every node.

Runs train.yml with detach=true on the local cluster (or -i INVENTORY) for each
node count, then polls every node's journal until each shows its first
"train step" line (rank 0) or its worker's startup line (other ranks), and
prints the seconds from the playbook's start, split into the playbook itself
and the time torchrun and the trainer took to reach step one. Stops the job
afterwards. A script, not a test: it prints figures.

    .venv/bin/python bench/bench_launch.py --nodes 2 4
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def ansible(args: list[str], inventory: str | None) -> subprocess.CompletedProcess[str]:
    inv = ["-i", inventory] if inventory else []
    return subprocess.run([str(BIN / args[0]), *inv, *args[1:]], cwd=REPO, capture_output=True,
                          text=True, check=False, timeout=900)


def first_step_seen(job: str, nodes: int, inventory: str | None) -> bool:
    """True once every node's journal shows a worker past its first training step."""
    proc = ansible(["ansible", f"cluster[0:{nodes - 1}]", "-b", "-m", "ansible.builtin.command", "-a",
                    f"journalctl -u torchrig-job@{job} -o cat --no-pager", "-o"], inventory)
    lines = [line for line in proc.stdout.splitlines() if "|" in line]
    if len(lines) < nodes:
        return False
    # Rank 0 logs "train step N"; every worker logs "torchrig: rank R" once it
    # has joined the process group, which the first step needs on every rank.
    ready = [("torchrig: rank" in line) for line in lines]
    return all(ready) and any("train step" in line for line in lines)


def measure(nodes: int, inventory: str | None) -> tuple[float, float]:
    job = f"bench-launch-{nodes}"
    t0 = time.monotonic()
    proc = ansible(["ansible-playbook", "train.yml", "-e", f"nodes={nodes}", "-e", f"job={job}",
                    "-e", "detach=true", "-e", "dataset=digits", "-e", "epochs=50",
                    "-e", '{"train_options": {"log-every": 1, "resume": false}}'], inventory)
    if proc.returncode != 0:
        sys.exit(f"train.yml failed:\n{proc.stdout[-3000:]}")
    t_playbook = time.monotonic() - t0
    while not first_step_seen(job, nodes, inventory):
        if time.monotonic() - t0 > 600:
            sys.exit("no first step within 600 s")
        time.sleep(0.5)
    t_step = time.monotonic() - t0
    ansible(["ansible-playbook", "playbooks/stop.yml", "-e", f"job={job}"], inventory)
    return t_playbook, t_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[2])
    parser.add_argument("-i", "--inventory", help="inventory (default: the local cluster)")
    args = parser.parse_args()
    print(f"{'nodes':>5} {'train.yml returned s':>21} {'first step on all s':>20}")
    results = {}
    for n in args.nodes:
        results[n] = measure(n, args.inventory)
        print(f"{n:>5} {results[n][0]:>21.1f} {results[n][1]:>20.1f}", flush=True)
    if len(results) > 1:
        lo, hi = min(results), max(results)
        print(f"first-step latency ratio {hi} nodes / {lo} nodes: {results[hi][1] / results[lo][1]:.2f}")


if __name__ == "__main__":
    main()
