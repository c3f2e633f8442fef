#!/usr/bin/env python3
"""All-reduce bus bandwidth on the cluster network, as a fraction of the iperf3 ceiling, by message size.

Runs `playbooks/health.yml` (iperf3 between neighbouring nodes, then
torchrig.allreduce_bench under torchrun across the nodes) on the local
cluster, or -i INVENTORY, and prints, for every message size, the time,
algbw and busbw as nccl-tests defines them and busbw over the slowest
iperf3 link measured in the same run. A script, not a test: it prints
figures.

    .venv/bin/python bench/bench_allreduce.py                  # 1K .. 256M on node1, node2
    .venv/bin/python bench/bench_allreduce.py --nodes node1,node2,node3,node4 --max-bytes 64M
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from ansible_cli import ansible


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="node1,node2", help="comma-separated inventory names")
    parser.add_argument("--max-bytes", default="256M", help="largest message (1K, 64M, 256M, ...)")
    parser.add_argument("-i", "--inventory", help="inventory (default: the local cluster)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="torchrig-bench-allreduce-") as results:
        ansible(["ansible-playbook", "playbooks/health.yml", "-e", f"nodes={args.nodes}",
                 "-e", f"health_max_bytes={args.max_bytes}", "-e", f"results_dir={results}"],
                args.inventory)
        report = json.loads((Path(results) / "health" / "report.json").read_text())

    links = {node: gbps for node, gbps in report["iperf3_gbps"].items() if gbps is not None}
    if not links:
        sys.exit("no iperf3 figure: the bench needs at least 2 nodes")
    ceiling = min(links.values())
    allreduce = report["allreduce"]
    print("iperf3 (node -> next node, Gbit/s): "
          + ", ".join(f"{node} {gbps:.2f}" for node, gbps in links.items()) + f"; ceiling {ceiling:.2f}")
    print(f"all_reduce (sum, float32), {allreduce['world_size']} ranks, {allreduce['backend']} on "
          f"{allreduce['device']}")
    print(f"{'bytes':>12} {'time us':>12} {'algbw GB/s':>11} {'busbw GB/s':>11} {'busbw/iperf3':>13}")
    for row in allreduce["results"]:
        ratio = row["busbw_GBps"] * 8 / ceiling
        print(f"{row['bytes']:>12} {row['time_us']:>12.1f} {row['algbw_GBps']:>11.3f} "
              f"{row['busbw_GBps']:>11.3f} {ratio:>13.3f}")


if __name__ == "__main__":
    main()
