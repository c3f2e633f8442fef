#!/usr/bin/env python3
"""Launch latency: from `ansible-playbook train.yml` to the first training step on every node.

Runs train.yml with detach=true on the local cluster (or -i INVENTORY) for each
node count, waits until the job has taken its first step, and reads the times
from the nodes' journals (short-unix timestamps), so the polling interval does
not enter the figures. Printed, in seconds from the playbook's start:

- playbook: train.yml returned (the service was started on every node);
- started: the last node's systemd started the unit;
- workers: the last node's worker joined the process group ("torchrig: rank");
- first step: rank 0 logged step 1. DDP's all-reduce in step 1's backward pass
  needs every rank, so this is the first step on every node.

The node clocks must agree with the controller's (the local cluster's
containers share its clock; on real hosts, playbooks/health.yml measures the
offsets). The job is stopped afterwards. Best of --repeat runs. A script, not
a test: it prints figures.

    .venv/bin/python bench/bench_launch.py --nodes 2 4
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import dataclass

from ansible_cli import ansible, on_nodes


@dataclass
class Launch:
    """Seconds from the playbook's start."""

    playbook: float
    started: float
    workers: float
    first_step: float


def journal_times(job: str, nodes: int, inventory: str | None) -> dict[str, list[tuple[float, str]]]:
    """Each node's journal of the job as (unix time, message) pairs."""
    out = on_nodes(f"cluster[0:{nodes - 1}]",
                   f"journalctl -u torchrig-job@{job} -o short-unix --no-pager", inventory)
    times = {}
    for host, text in out.items():
        lines = (re.match(r"^(\d+\.\d+) \S+ [^:]+: (.*)$", line) for line in text.splitlines())
        times[host] = [(float(m.group(1)), m.group(2)) for m in lines if m]
    return times


def first(lines: list[tuple[float, str]], pattern: str) -> float | None:
    return next((t for t, msg in lines if re.search(pattern, msg)), None)


def measure(nodes: int, inventory: str | None) -> Launch:
    job = f"bench-launch-{nodes}"
    ansible(["ansible-playbook", "playbooks/stop.yml", "-e", f"job={job}"], inventory)
    t0 = time.time()  # wall clock: compared with the journals' timestamps
    ansible(["ansible-playbook", "train.yml", "-e", f"nodes={nodes}", "-e", f"job={job}",
             "-e", "detach=true", "-e", "dataset=digits", "-e", "epochs=50",
             "-e", '{"train_options": {"log-every": 1, "resume": false}}'], inventory)
    playbook = time.time() - t0
    while True:
        journals = journal_times(job, nodes, inventory)
        # The journals keep earlier runs of the same job: only lines after t0 count.
        journals = {h: [(t, m) for t, m in lines if t >= t0] for h, lines in journals.items()}
        step = [first(lines, r"train step 1 ") for lines in journals.values()]
        if len(journals) == nodes and any(step):
            break
        if time.time() - t0 > 600:
            sys.exit(f"no first step within 600 s; journals: {journals}")
        time.sleep(1)
    started = [first(lines, r"^Started torchrig-job@") for lines in journals.values()]
    workers = [first(lines, r"^torchrig: rank \d+ ") for lines in journals.values()]
    ansible(["ansible-playbook", "playbooks/stop.yml", "-e", f"job={job}"], inventory)
    if None in started or None in workers:
        sys.exit(f"a node's journal lacks its start or its worker: {journals}")
    return Launch(playbook, max(started) - t0, max(workers) - t0, max(filter(None, step)) - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[2])
    parser.add_argument("--repeat", type=int, default=2, help="runs per node count; the best counts")
    parser.add_argument("-i", "--inventory", help="inventory (default: the local cluster)")
    args = parser.parse_args()
    print(f"{'nodes':>5} {'playbook s':>11} {'started s':>10} {'workers s':>10} {'first step s':>13}")
    results = {}
    for n in args.nodes:
        runs = [measure(n, args.inventory) for _ in range(args.repeat)]
        r = results[n] = min(runs, key=lambda launch: launch.first_step)
        print(f"{n:>5} {r.playbook:>11.1f} {r.started:>10.1f} {r.workers:>10.1f} {r.first_step:>13.1f}"
              f"   (all runs: {', '.join(f'{x.first_step:.1f}' for x in runs)})", flush=True)
    if len(results) > 1:
        lo, hi = min(results), max(results)
        print(f"first-step latency ratio {hi} nodes / {lo} nodes: "
              f"{results[hi].first_step / results[lo].first_step:.2f}")


if __name__ == "__main__":
    main()
