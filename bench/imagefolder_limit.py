#!/usr/bin/env python3
"""The built-in trainer streams an ImageFolder data set larger than the job's memory limit.

A generated ImageFolder data set (torchrig.make_images: 4 classes, colour and stripes
under heavy noise, uncompressed images, 2.1 GiB by default) is staged with train.yml's
`-e data=` and trained on across the nodes with `-e dataset=imagefolder` under a
memory limit smaller than the data (`torchrun_memory_max`, the unit's MemoryMax=).
Then, as the control, a script that reads every file of the same data into memory
runs under the same limit. It prints:

- the data's size and the limit;
- the trainer's held-out accuracy, steps and samples/s, whether it resumed (a restart),
  and every note of the kernel ending one of its processes at the limit (none expected);
- the control's end: train.yml fails, each node's journal noting the kernel's kill.

The limit holds only where systemd on the nodes can write the memory controller (any
server; the local cluster's nodes on a cgroup v1 host through local_cluster_job_limits).
It needs an inventory of provisioned nodes (group cluster):

    .venv/bin/python bench/imagefolder_limit.py -i inventory/local --nodes 2 --limit 1536M
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from ansible_cli import REPO, ansible, on_nodes

sys.path.insert(0, str(REPO / "training" / "src"))
from torchrig.contract import MEMORY_NOTE  # noqa: E402
from torchrig.make_images import generate  # noqa: E402

CONTROL = Path(__file__).resolve().parent / "load_all.py"


def notes(job_results: Path) -> list[str]:
    """Each node's journal lines (fetched to runs/<job>/logs/) of the kernel ending one of
    the job's processes at its memory limit, from the note on."""
    found = set()
    for log in sorted((job_results / "logs").glob("*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if MEMORY_NOTE in line:
                found.add(line[line.index(MEMORY_NOTE):])
    return sorted(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-i", "--inventory", default="inventory/local")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--limit", default="1536M", help="the job's memory limit (torchrun_memory_max)")
    parser.add_argument("--data", type=Path, default=Path.home() / ".cache/torchrig/bench-imagefolder",
                        help="where the generated data set is kept (made once)")
    parser.add_argument("--train", type=int, default=4800, help="training images per class (4 classes)")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    made = args.data / f"{args.train}"
    if not (made / "val").is_dir():
        files, _ = generate(made, classes=4, train=args.train, val=250, size=(160, 224))
        print(f"generated {files} files in {made}")
    size = sum(p.stat().st_size for p in made.rglob("*") if p.is_file())
    print(f"data: {size / 2**30:.2f} GiB in {made}; the job's memory limit: {args.limit}")
    common = ["-e", f"nodes={args.nodes}", "-e", f"data={made}", "-e", f"torchrun_memory_max={args.limit}"]
    results = REPO / "runs"
    # Jobs of their own each time: a job's checkpoints stay on its nodes, and the same name
    # would resume from the last run's end.
    stamp = time.strftime("%Y%m%d%H%M%S")
    job, control_job = f"bench-imagefolder-{stamp}", f"bench-load-all-{stamp}"
    ansible(["ansible-playbook", "train.yml", *common, "-e", "dataset=imagefolder",
             "-e", f"epochs={args.epochs}", "-e", f"job={job}"], args.inventory)
    summary = json.loads((results / job / "summary.json").read_text())
    print(f"trainer: held-out accuracy {summary['accuracy']:.4f} (chance 0.25), {summary['steps']} steps, "
          f"{summary['samples_per_s']:.0f} samples/s, world size {summary['world_size']}, "
          f"resumed from step {summary['resumed_from_step']} (None: no restart)")
    print(f"trainer: processes the kernel ended at the limit: {notes(results / job) or 'none'}")
    control = ansible(["ansible-playbook", "train.yml", *common, "-e", f"script={CONTROL}",
                       "-e", f"job={control_job}", "-e", "max_restarts=0"], args.inventory, check=False)
    print(f"control (every file read into memory): train.yml exit {control.returncode}; "
          f"{notes(results / control_job) or 'no note of the kernel ending it'}")
    on_nodes("cluster", f"rm -rf /var/lib/torchrig/runs/{job} /var/lib/torchrig/runs/{control_job}", args.inventory)
    for name in (job, control_job):
        shutil.rmtree(results / f"{name}.runs", ignore_errors=True)
        (results / name).unlink(missing_ok=True)


if __name__ == "__main__":
    main()
