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

Each is run --repeat times, alternating which goes first, and every timed run starts
after a `sync`: the one before it leaves gigabytes of dirty pages that the disk would
otherwise be writing back during the next. It prints each round's times and the ratio
torchrig / rsync, their medians, the peaks, and whether every file's sha256 is the node's.

It needs an inventory with a node reached over SSH with passwordless sudo, rsync and
python3 (a local-cluster node will do; no provisioning needed):

    .venv/bin/python bench/fetch.py -i inventory/local --node node1 --big-mb 1024 --small 10000 --repeat 3
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import re
import shlex
import statistics
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
    parser.add_argument("--repeat", type=int, default=3, help="rounds of both, alternating which goes first")
    args = parser.parse_args()
    user = job_user()
    run_dir = f"/var/lib/torchrig/runs/{JOB}"
    setup = (f"set -e; id {user} >/dev/null 2>&1 || "
             f"useradd --system --no-create-home --shell /usr/sbin/nologin {user}; "
             f"rm -rf {run_dir}; mkdir -p {run_dir}/output/small /etc/torchrig/jobs; "
             f"for i in 1 2; do head -c {args.big_mb}M /dev/urandom > {run_dir}/output/big$i.bin; done; "
             f"cd {run_dir}/output/small && head -c {args.small * 1024} /dev/urandom | split -b 1024 -a 5 -d - f; "
             f"chown -R {user}:{user} {run_dir}; chmod 0700 {run_dir}; echo {RUN_ID} > /etc/torchrig/jobs/{JOB}.run; "
             f"cd {run_dir} && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum")
    made = on_nodes(args.node, setup, args.inventory)
    if args.node not in made:
        sys.exit(f"could not make the job's files on {args.node}")
    files = 2 + args.small
    size = 2 * args.big_mb * 2**20 + args.small * 1024
    print(f"{args.node}: {size / 2**30:.2f} GiB in {files} files (2 of {args.big_mb} MiB, {args.small} of 1 KiB)")
    ssh, target = ssh_command(args.inventory, args.node)
    want = made[args.node].split()[0]
    mib = 2**20
    rounds = []
    print(f"{'round':>5} {'first':>8} {'torchrig s':>10} {'transfer s':>10} {'rsync s':>8} {'ratio':>6} "
          f"{'peak MiB':>9} {'rsync peak':>10} {'sha256':>7}")
    for i in range(args.repeat):
        with tempfile.TemporaryDirectory(dir=REPO) as tmp:
            first = "torchrig" if i % 2 == 0 else "rsync"
            got: dict[str, tuple[float, int, float]] = {}
            for which in (["torchrig", "rsync"] if first == "torchrig" else ["rsync", "torchrig"]):
                os.sync()
                if which == "torchrig":
                    # profile_tasks gives the transfer task's own time: the rest of the run is
                    # the same whatever the size (the listing, the checks, the journals).
                    sec, peak, run = timed([str(BIN / "ansible-playbook"), "-i", args.inventory, "playbooks/fetch.yml",
                                            "-e", f"job={JOB}", "-e", f"group={args.node}",
                                            "-e", f"results_dir={tmp}/t"],
                                           env={"ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks"})
                    step = re.search(r"Fetch the job's output files -+ ([0-9.]+)s", run.stdout)
                    got[which] = (sec, peak, float(step[1]) if step else float("nan"))
                else:
                    sec, peak, _ = timed(["rsync", "-a", "--rsync-path", "sudo rsync", "-e", ssh,
                                          f"{target}:{run_dir}/", f"{tmp}/r/"])
                    got[which] = (sec, peak, sec)
            same = (listing_digest(Path(tmp) / "t" / f"{JOB}.runs" / RUN_ID / "nodes" / args.node) == want
                    and listing_digest(Path(tmp) / "r") == want)
        (t_sec, t_peak, transfer), (r_sec, r_peak, _) = got["torchrig"], got["rsync"]
        rounds.append((t_sec, transfer, r_sec, t_peak, same))
        print(f"{i + 1:>5} {first:>8} {t_sec:>10.1f} {transfer:>10.1f} {r_sec:>8.1f} {t_sec / r_sec:>6.2f} "
              f"{t_peak / mib:>9.0f} {r_peak / mib:>10.0f} {str(same):>7}")
    on_nodes(args.node, f"rm -rf {run_dir} /etc/torchrig/jobs/{JOB}.run", args.inventory)
    ratios = [r[0] / r[2] for r in rounds]
    print(f"time torchrig / rsync (the whole fetch.yml run): median {statistics.median(ratios):.2f} "
          f"of {len(ratios)} rounds ({', '.join(f'{x:.2f}' for x in ratios)})")
    print(f"of which the transfer task: median {statistics.median(r[1] / r[2] for r in rounds):.2f} times rsync; "
          f"the rest of the run, which does not grow with the data: median "
          f"{statistics.median(r[0] - r[1] for r in rounds):.1f} s")
    print(f"every file's sha256 equal to the node's, both ways, every round: {all(r[4] for r in rounds)}")
    print(f"controller's peak memory during torchrig's fetch: {max(r[3] for r in rounds) / mib:.0f} MiB "
          "(limit 300 MB)")


if __name__ == "__main__":
    main()
