#!/usr/bin/env python3
"""Bytes the controller sends to stage a job's data (train.yml's -e data=), against node count.

A directory of generated files (2 GiB in 5,000 files by default) is staged with
`playbooks/stage.yml` to 1, 2 and 3 nodes, each case starting with no data on any
node. The controller sends it to one node, which passes it on to the others over the
training network, so the controller's bytes should not grow with the nodes. For each
case it prints the bytes the controller sent, two ways:

- rsync: rsync's own --stats of the controller's transfer (the data and rsync's
  protocol), as the play reports it;
- wire: every byte the nodes received from the controller's address (the SSH
  connection: the transfer, and Ansible's own modules), counted by an nftables
  counter that the script adds on every node (table inet torchrig_bench).

Then the ratio 3 nodes / 1 node, a second staging of the same data (its changed
count and bytes), and a staging after one file changed. Every node's copy is
checked equal to the controller's (sha256 of every file).

It needs an inventory of at least 3 provisioned nodes in group cluster, whose
default route goes to the controller (the local cluster's nodes, or a scenario's).

    .venv/bin/python bench/stage.py -i inventory/local --size-mb 2048 --files 5000
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import sys
import tempfile
import time
from pathlib import Path

from ansible_cli import ansible, on_nodes

COUNTER_TABLE = "torchrig_bench"
DATA_ROOT = "/var/lib/torchrig/data"


def make_data(root: Path, size: int, files: int) -> None:
    """`files` files of random bytes (incompressible) in 50 directories, `size` bytes in all."""
    rng = random.Random(0)
    each = size // files
    block = rng.randbytes(1 << 20)
    for i in range(files):
        path = root / f"d{i % 50:02d}" / f"f{i:05d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        # A unique head, then a shared block: unique content at disk speed.
        head = rng.randbytes(min(each, 4096))
        rest = each - len(head)
        with path.open("wb") as f:
            f.write(head)
            while rest > 0:
                f.write(block[:min(rest, len(block))])
                rest -= min(rest, len(block))


def start_counters(inventory: str) -> None:
    """Count, on every node, the bytes that arrive from the controller (the nodes' gateway)."""
    rules = (f"nft delete table inet {COUNTER_TABLE} 2>/dev/null; "
             "gateway=$(ip -o -4 route show default | awk '{print $3}'); "
             f"nft add table inet {COUNTER_TABLE} && "
             f"nft add chain inet {COUNTER_TABLE} input '{{ type filter hook input priority -400; }}' && "
             f"nft add rule inet {COUNTER_TABLE} input ip saddr $gateway counter comment controller && echo $gateway")
    out = on_nodes("cluster", rules, inventory)
    if not out:
        sys.exit("could not add the byte counters on the nodes")


def read_counters(inventory: str) -> int:
    out = on_nodes("cluster", f"nft -j list table inet {COUNTER_TABLE}", inventory)
    total = 0
    for text in out.values():
        for item in json.loads(text)["nftables"]:
            rule = item.get("rule")
            if rule and rule.get("comment") == "controller":
                total += sum(e["counter"]["bytes"] for e in rule["expr"] if "counter" in e)
    return total


def stage(inventory: str, data: Path, nodes: int) -> tuple[int, int, int, float]:
    """(rsync bytes the controller sent, wire bytes from it, changed count, seconds)."""
    start_counters(inventory)
    t0 = time.monotonic()
    proc = ansible(["ansible-playbook", "playbooks/stage.yml", "-e", f"data={data}", "-e", f"nodes={nodes}"],
                   inventory)
    seconds = time.monotonic() - t0
    wire = read_counters(inventory)
    m = re.search(r"the controller sent (\d+) bytes", proc.stdout)
    changed = sum(int(n) for n in re.findall(r"\bchanged=(\d+)", proc.stdout.split("PLAY RECAP")[-1]))
    return int(m[1]) if m else 0, wire, changed, seconds


def node_hashes(inventory: str) -> dict[str, str]:
    """Each node's digest of its staged files: sha256 of the sorted 'sha256  ./name' lines."""
    out = on_nodes("cluster", f"cd {DATA_ROOT} && for d in [0-9a-f]*; do (cd $d && find . -type f -print0 "
                   "| sort -z | xargs -0 sha256sum | sha256sum); done", inventory)
    return {host: text.split()[0] if text else "" for host, text in out.items()}


def local_hash(data: Path) -> str:
    lines = []
    for p in sorted(data.rglob("*"), key=lambda p: "./" + str(p.relative_to(data))):
        if p.is_file():
            lines.append(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  ./{p.relative_to(data)}\n")
    # sort -z orders names bytewise, as Python's sort of str does for ASCII names.
    lines.sort(key=lambda line: line.split("  ", 1)[1])
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-i", "--inventory", required=True, help="an inventory of at least 3 provisioned nodes")
    parser.add_argument("--size-mb", type=int, default=2048, help="the data's size, MiB")
    parser.add_argument("--files", type=int, default=5000, help="the data's file count")
    args = parser.parse_args()
    mib = 1 << 20
    with tempfile.TemporaryDirectory(prefix="torchrig-bench-data-") as tmp:
        data = Path(tmp) / "data"
        make_data(data, args.size_mb * mib, args.files)
        size = sum(p.stat().st_size for p in data.rglob("*") if p.is_file())
        print(f"data: {size / mib:.0f} MiB in {args.files} files")
        print(f"{'nodes':>5} {'rsync MiB':>10} {'wire MiB':>9} {'changed':>8} {'seconds':>8}")
        sent: dict[int, tuple[int, int, int, float]] = {}
        for n in (1, 2, 3):
            on_nodes("cluster", f"rm -rf {DATA_ROOT}", args.inventory)
            sent[n] = stage(args.inventory, data, n)
            r, w, c, s = sent[n]
            print(f"{n:>5} {r / mib:>10.1f} {w / mib:>9.1f} {c:>8} {s:>8.1f}", flush=True)
        want = local_hash(data)
        got = node_hashes(args.inventory)
        print(f"every node's copy equal to the controller's: {all(v == want for v in got.values())} "
              f"({len(got)} nodes)")
        print(f"controller sent, 3 nodes / 1 node: rsync {sent[3][0] / sent[1][0]:.3f}, "
              f"wire {sent[3][1] / sent[1][1]:.3f}")
        r, w, c, s = stage(args.inventory, data, 3)
        print(f"second staging, 3 nodes: changed={c}, rsync {r} bytes, wire {w / mib:.2f} MiB, {s:.1f} s")
        changed = next(iter(sorted(data.rglob("*.bin"))))
        changed.write_bytes(random.Random(1).randbytes(changed.stat().st_size))
        r, w, c, s = stage(args.inventory, data, 3)
        print(f"one file of {changed.stat().st_size / mib:.2f} MiB changed, 3 nodes: rsync {r / mib:.2f} MiB, "
              f"wire {w / mib:.2f} MiB, changed={c}, {s:.1f} s")
        on_nodes("cluster", f"nft delete table inet {COUNTER_TABLE}", args.inventory)


if __name__ == "__main__":
    main()
