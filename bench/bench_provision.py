#!/usr/bin/env python3
"""Provisioning time and bytes downloaded from outside the cluster, against node count.

For each node count N: a fresh local cluster of N nodes (`local-cluster.yml`,
nodes removed and started again), then `provision.yml` twice. It prints the
first run's time, the second (no-op) run's time and its changed count, and
the bytes that came from outside the cluster, and the CPU seconds behind
each run (each node's container, and the rest of the machine: the
controller's Ansible, ssh and rsync):

- controller: what it downloaded for the cluster into empty caches: the
  wheelhouse (`pip download`), and with torchrig_package_source cluster the
  apt side too (the index files and .debs under the package cache);
- nodes: bytes each node received from addresses outside the cluster's
  subnet (apt, and pip in `index` mode), counted by an nftables counter that
  the script adds on every node before provisioning (table inet
  torchrig_bench; the firewall role leaves other tables alone).

and the bytes the controller sent to the nodes (everything from the
controller's address: the pushes and Ansible's own traffic), counted by a
second counter on every node.

Then the ratios of the largest node count to the smallest. A script, not a
test: it prints figures. It replaces the local cluster (`make up` afterwards
gives a 2-node one back).

    .venv/bin/python bench/bench_provision.py --nodes 1 2 4
    .venv/bin/python bench/bench_provision.py --nodes 1 2 --source index   # nodes reach the index
    .venv/bin/python bench/bench_provision.py --packages upstream          # each node its own apt
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ansible_cli import ansible, on_nodes
from cpu_meter import CpuMeter, CpuUse

COUNTER_TABLE = "torchrig_bench"


@dataclass
class Run:
    """One node count's figures."""

    nodes: int
    first_s: float
    second_s: float
    second_changed: int
    controller_bytes: int
    node_bytes: list[int]
    sent_bytes: list[int]
    first_cpu: CpuUse
    second_cpu: CpuUse

    @property
    def outside_bytes(self) -> int:
        return self.controller_bytes + sum(self.node_bytes)


def changed_total(recap: str) -> int:
    """Sum of changed= over the PLAY RECAP lines."""
    return sum(int(n) for n in re.findall(r"\bchanged=(\d+)", recap.split("PLAY RECAP")[-1]))


def start_counters(nodes: int) -> None:
    """Count, on every node, the bytes that arrive from outside its own subnet, and from the controller.

    The controller is the subnet's gateway (the machine that runs the
    containers), which is how the nodes see it.
    """
    # Every network the node is on (the local cluster's nodes have two:
    # management and training, where the package host serves).
    rules = (
        "subnets=$(ip -o -4 route show scope link | awk '{print $1}' | paste -sd, -); "
        "gateway=$(ip -o -4 route show default | awk '{print $3}'); "
        f"nft add table inet {COUNTER_TABLE} && "
        f"nft add chain inet {COUNTER_TABLE} input '{{ type filter hook input priority -400; }}' && "
        f"nft add rule inet {COUNTER_TABLE} input ip saddr != {{ $subnets }} counter comment outside && "
        f"nft add rule inet {COUNTER_TABLE} input ip saddr $gateway counter comment controller && "
        "echo $subnets"
    )
    subnets = on_nodes(f"cluster[0:{nodes - 1}]", rules)
    if len(subnets) != nodes:
        sys.exit(f"could not add the byte counters on every node: {subnets}")


def read_counters(nodes: int, comment: str) -> list[int]:
    """Each node's bytes counted by the rule with this comment."""
    out = on_nodes(f"cluster[0:{nodes - 1}]", f"nft -j list table inet {COUNTER_TABLE}")
    counts = []
    for text in out.values():
        rules = [item["rule"] for item in json.loads(text)["nftables"]
                 if "rule" in item and item["rule"].get("comment") == comment]
        counts.append(sum(expr["counter"]["bytes"] for rule in rules for expr in rule["expr"] if "counter" in expr))
    return counts


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def fetched_bytes(package_cache: Path) -> int:
    """What apt on the controller downloaded: each apt root's index files and .debs.

    The cluster repositories under repo/ are copies of those .debs, not downloads.
    """
    roots = package_cache / "roots"
    if not roots.is_dir():
        return 0
    return sum(tree_bytes(root / "state" / "lists") + tree_bytes(root / "archives") for root in roots.iterdir())


def measure(nodes: int, source: str, packages: str) -> Run:
    ansible(["ansible-playbook", "playbooks/local-cluster.yml", "-e", "state=absent"])
    ansible(["ansible-playbook", "playbooks/local-cluster.yml", "-e", f"nodes={nodes}"])
    start_counters(nodes)
    with tempfile.TemporaryDirectory(prefix="torchrig-bench-wheelhouse-") as wheelhouse, \
            tempfile.TemporaryDirectory(prefix="torchrig-bench-packages-") as package_cache:
        # Empty caches and no pip cache: the controller downloads as on a new machine.
        args = ["-e", f"pytorch_wheelhouse_cache={wheelhouse}", "-e", f"pytorch_source={source}",
                "-e", f"torchrig_package_source={packages}", "-e", f"package_source_cache={package_cache}"]
        env = {"PIP_NO_CACHE_DIR": "1"}
        names = [f"node{i}" for i in range(1, nodes + 1)]
        meter, t0 = CpuMeter(names), time.monotonic()
        ansible(["ansible-playbook", "provision.yml", *args], env=env)
        first, first_cpu = time.monotonic() - t0, meter.used()
        controller = tree_bytes(Path(wheelhouse)) + fetched_bytes(Path(package_cache))
        node_bytes, sent = read_counters(nodes, "outside"), read_counters(nodes, "controller")
        meter, t0 = CpuMeter(names), time.monotonic()
        second = ansible(["ansible-playbook", "provision.yml", *args], env=env)
        second_s, second_cpu = time.monotonic() - t0, meter.used()
    return Run(nodes, first, second_s, changed_total(second.stdout), controller, node_bytes, sent,
               first_cpu, second_cpu)


def cpu_line(label: str, wall: float, use: CpuUse) -> str:
    """CPU seconds of a run, and how many cores it kept busy on average."""
    each = "/".join(f"{s:.0f}" for s in use.nodes.values())
    return (f"      {label}: CPU s: nodes {each} (mean {use.per_node:.1f}), controller and rest "
            f"{use.controller:.1f}, total {use.total:.1f} = {use.total / wall:.2f} cores busy")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--source", choices=["wheelhouse", "index"], default="wheelhouse",
                        help="pytorch_source: one download on the controller, or one per node")
    parser.add_argument("--packages", choices=["cluster", "upstream"], default="cluster",
                        help="torchrig_package_source: the cluster's own source, or each node its own apt")
    args = parser.parse_args()
    mb = 1e6
    print(f"source={args.source} packages={args.packages}")
    print(f"{'nodes':>5} {'first run s':>12} {'second run s':>13} {'changed':>8} "
          f"{'controller MB':>14} {'nodes MB (each)':>22} {'outside MB':>11} {'sent MB (each)':>24}")
    results: dict[int, Run] = {}
    for n in args.nodes:
        r = results[n] = measure(n, args.source, args.packages)
        each = "/".join(f"{b / mb:.0f}" for b in r.node_bytes)
        sent = "/".join(f"{b / mb:.0f}" for b in r.sent_bytes)
        print(f"{n:>5} {r.first_s:>12.1f} {r.second_s:>13.1f} {r.second_changed:>8} "
              f"{r.controller_bytes / mb:>14.1f} {each:>22} {r.outside_bytes / mb:>11.1f} "
              f"{sum(r.sent_bytes) / mb:>9.1f} ({sent})")
        print(cpu_line("first run ", r.first_s, r.first_cpu))
        print(cpu_line("second run", r.second_s, r.second_cpu), flush=True)
    if len(results) > 1:
        lo, hi = results[min(results)], results[max(results)]
        print(f"time({hi.nodes})/time({lo.nodes}), first run: {hi.first_s / lo.first_s:.2f}")
        print(f"CPU s per node({hi.nodes})/({lo.nodes}), first run: "
              f"{hi.first_cpu.per_node / lo.first_cpu.per_node:.2f}; second run: "
              f"{hi.second_cpu.per_node / lo.second_cpu.per_node:.2f}")
        print(f"time({hi.nodes})/time({lo.nodes}), second run: {hi.second_s / lo.second_s:.2f}")
        print(f"outside bytes({hi.nodes})/outside bytes({lo.nodes}): {hi.outside_bytes / lo.outside_bytes:.3f}")
        print(f"controller sent({hi.nodes})/controller sent({lo.nodes}), first run: "
              f"{sum(hi.sent_bytes) / sum(lo.sent_bytes):.3f}")


if __name__ == "__main__":
    main()
