#!/usr/bin/env python3
"""A job's results home: torchrig's fetch against plain rsync of the same files.

On one node a job's run directory is made as a script would leave it: 2 GiB in 2 files
and 10,000 small files by default, owned by the job's user. Then, in the same run:

- torchrig: `playbooks/fetch.yml -e job=...` (the listing as the job's user, the
  checks, rsync over Ansible's SSH settings as the job's user), timed, with the
  controller's peak memory: the sum of the resident memory of ansible-playbook and
  every process under it (its workers, ssh, rsync), sampled every 0.1 s;
- rsync: one plain `rsync -a` of the same directory between the same hosts, over the
  same SSH options and user (sudo on the node), timed, with its peak memory the same way.

It prints both times and the ratio torchrig / rsync, both peaks, and whether every
file's sha256 is the node's.

It needs an inventory with a node reached over SSH with passwordless sudo, rsync and
python3 (a local-cluster node will do; no provisioning needed):

    .venv/bin/python bench/fetch.py -i inventory/local --node node1 --big-mb 1024 --small 10000
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ansible_cli import BIN, REPO, ansible, on_nodes

JOB = "bench-fetch"
RUN_ID = "20000101T000000Z"


def job_user() -> str:
    """The job's user, as the torchrun role names it."""
    spec = importlib.util.spec_from_file_location(
        "torchrun_user", REPO / "roles/torchrun/filter_plugins/torchrun_user.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.job_user(JOB)


def tree_rss(pid: int) -> int:
    """Resident bytes of `pid` and every process under it."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                total += next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:")), 0)
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            continue
    return total


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, int, subprocess.CompletedProcess[str]]:
    """Run cmd from the repository root; (seconds, peak tree RSS in bytes, the result)."""
    start = time.monotonic()
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, **(env or {})})
        peak = 0
        while proc.poll() is None:
            peak = max(peak, tree_rss(proc.pid))
            time.sleep(0.1)
        seconds = time.monotonic() - start
        out.seek(0)
        result = subprocess.CompletedProcess(cmd, proc.returncode, out.read(), "")
    if result.returncode != 0:
        sys.exit(f"{' '.join(cmd[:3])} ... failed (exit {result.returncode}):\n{result.stdout[-4000:]}")
    return seconds, peak, result


def ssh_command(inventory: str, node: str) -> tuple[str, str]:
    """(the ssh command rsync's -e takes, user@address) as Ansible reaches the node."""
    hostvars = json.loads(ansible(["ansible-inventory", "--host", node], inventory).stdout)
    cfg = subprocess.run([str(BIN / "ansible-config"), "dump", "--only-changed", "-t", "connection",
                          "--format", "json"], cwd=REPO, capture_output=True, text=True, check=False).stdout
    # Grouped by plugin: [{"ssh": [{"name": "ssh_args", "value": ...}, ...]}].
    ssh_settings = [c for group in json.loads(cfg or "[]") for c in group.get("ssh", [])]
    ssh_args = next((c["value"] for c in ssh_settings if c["name"] == "ssh_args"), "")
    ssh = ["ssh", *shlex.split(ssh_args or ""), *shlex.split(hostvars.get("ansible_ssh_common_args", ""))]
    if hostvars.get("ansible_ssh_private_key_file"):
        ssh += ["-i", hostvars["ansible_ssh_private_key_file"]]
    if hostvars.get("ansible_port"):
        ssh += ["-p", str(hostvars["ansible_port"])]
    return shlex.join(ssh), f"{hostvars.get('ansible_user', 'root')}@{hostvars.get('ansible_host', node)}"


def local_hashes(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h = hashlib.sha256()
            with p.open("rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
            out[p.relative_to(root).as_posix()] = h.hexdigest()
    return out


def listing_digest(root: Path) -> str:
    """sha256 of `sha256sum`'s lines for every file, as the node computes it."""
    lines = "".join(f"{h}  ./{rel}\n" for rel, h in sorted(local_hashes(root).items()))
    return hashlib.sha256(lines.encode()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-i", "--inventory", default="inventory/local")
    parser.add_argument("--node", default="node1")
    parser.add_argument("--big-mb", type=int, default=1024, help="size of each of the 2 big files (MiB)")
    parser.add_argument("--small", type=int, default=10000, help="number of small files (1 KiB each)")
    args = parser.parse_args()
    user = job_user()
    run = f"/var/lib/torchrig/runs/{JOB}"
    setup = (f"set -e; id {user} >/dev/null 2>&1 || "
             f"useradd --system --no-create-home --shell /usr/sbin/nologin {user}; "
             f"rm -rf {run}; mkdir -p {run}/output/small /etc/torchrig/jobs; "
             f"for i in 1 2; do head -c {args.big_mb}M /dev/urandom > {run}/output/big$i.bin; done; "
             f"cd {run}/output/small && head -c {args.small * 1024} /dev/urandom | split -b 1024 -a 5 -d - f; "
             f"chown -R {user}:{user} {run}; chmod 0700 {run}; echo {RUN_ID} > /etc/torchrig/jobs/{JOB}.run; "
             f"cd {run} && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum")
    made = on_nodes(args.node, setup, args.inventory)
    if args.node not in made:
        sys.exit(f"could not make the job's files on {args.node}")
    files = 2 + args.small
    size = 2 * args.big_mb * 2**20 + args.small * 1024
    print(f"{args.node}: {size / 2**30:.2f} GiB in {files} files (2 of {args.big_mb} MiB, {args.small} of 1 KiB)")
    ssh, target = ssh_command(args.inventory, args.node)
    with tempfile.TemporaryDirectory(dir=REPO) as tmp:
        # profile_tasks gives the transfer task's own time: the rest of the run is the
        # same whatever the size (the listing, the checks, the journals).
        t_sec, t_peak, t_run = timed([str(BIN / "ansible-playbook"), "-i", args.inventory, "playbooks/fetch.yml",
                                      "-e", f"job={JOB}", "-e", f"group={args.node}", "-e", f"results_dir={tmp}/t"],
                                     env={"ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks"})
        step = re.search(r"Fetch the job's output files -+ ([0-9.]+)s", t_run.stdout)
        transfer = float(step[1]) if step else float("nan")
        got = Path(tmp) / "t" / f"{JOB}.runs" / RUN_ID / "nodes" / args.node
        r_sec, r_peak, _ = timed(["rsync", "-a", "--rsync-path", "sudo rsync", "-e", ssh,
                                  f"{target}:{run}/", f"{tmp}/r/"])
        want = made[args.node].split()[0]
        same = listing_digest(got) == want
        same_r = listing_digest(Path(tmp) / "r") == want
    on_nodes(args.node, f"rm -rf {run} /etc/torchrig/jobs/{JOB}.run", args.inventory)
    mib = 2**20
    print(f"{'':>9} {'seconds':>8} {'MiB/s':>7} {'peak MiB':>9}")
    print(f"{'torchrig':>9} {t_sec:>8.1f} {size / mib / t_sec:>7.0f} {t_peak / mib:>9.0f}")
    print(f"{'rsync':>9} {r_sec:>8.1f} {size / mib / r_sec:>7.0f} {r_peak / mib:>9.0f}")
    print(f"time torchrig / rsync: {t_sec / r_sec:.2f} (the whole fetch.yml run)")
    print(f"of which the transfer task: {transfer:.1f} s, {transfer / r_sec:.2f} times rsync; "
          f"the other {t_sec - transfer:.1f} s do not grow with the data")
    print(f"every file's sha256 equal to the node's: torchrig {same}, rsync {same_r}")
    print(f"controller's peak memory during torchrig's fetch: {t_peak / mib:.0f} MiB (limit 300 MB)")


if __name__ == "__main__":
    main()
