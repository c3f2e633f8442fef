#!/usr/bin/python
"""Every torchrig job on a node: its unit's state, the GPUs it holds, its queue entry and
its progress, in one call (torchrig.cluster's module_utils/torchrun_gpus.py reads them).

The GPUs held come from what systemd says runs, so nothing can go stale. A job's metrics
are read as the job's own user (the owner of its run directory), never as root: a job
could link its metrics file to any file of the node.
"""

from __future__ import annotations

import json
import math
import os
import stat

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.torchrig.cluster.plugins.module_utils.torchrun_gpus import count_gpus, node_jobs, queue_entries

DOCUMENTATION = r"""
module: torchrun_jobs
short_description: Every torchrig job on a node, the GPUs each holds, the queue and progress
description:
  - Lists the jobs that have settings on this node, each with its unit's state, when it
    started, the GPUs it holds (while systemd says it runs) and, with run_root, its newest
    metrics line and that file's age, read as the job's user. Also the node's GPU count and
    its GPU queue. Changes nothing.
options:
  config_dir: {description: Where the jobs' .env and .gpus files are., type: path, default: /etc/torchrig/jobs}
  gpus_name: {description: The job contract's name of the GPU list in a job's .gpus file., type: str, required: true}
  gpus_dir: {description: Where the NVIDIA driver lists its GPUs., type: path, default: /proc/driver/nvidia/gpus}
  queue_dir: {description: The node's GPU queue., type: path, default: /etc/torchrig/queue}
  run_root: {description: Where the run directories are; empty to skip progress., type: str, default: ""}
  metrics: {description: A run directory's metrics file (the job contract's files.metrics)., type: str, required: true}
"""

RETURN = r"""
jobs: {description: "[{job, state, running, since, gpus, progress}]", type: list, returned: always}
gpus: {description: GPUs on this node., type: int, returned: always}
queue: {description: "The queue entries here, first come first: [{at, job, want}]", type: list, returned: always}
"""

# The tail of a metrics file that is read: a record line is far shorter.
TAIL = 65536


def last_record(path: str, uid: int, gid: int) -> dict:
    """The last whole JSON object line of `path` and the file's mtime, read in a child process
    that runs as uid/gid. {} when there is none or it cannot be read."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop root, then read
        try:
            os.close(read_fd)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            with open(path, "rb") as f:
                size = os.fstat(f.fileno())
                f.seek(max(size.st_size - TAIL, 0))
                lines = [x for x in f.read(TAIL).split(b"\n") if x.strip()]
            # A few lines: the last may be cut short (a full disk, a write in progress).
            out = json.dumps({"lines": [x.decode("utf-8", "replace") for x in lines[-4:]],
                              "mtime": int(size.st_mtime)})
            os.write(write_fd, out.encode()[:TAIL + 1024])
        except BaseException:  # noqa: BLE001 - the child must never return into Ansible
            pass
        finally:
            os._exit(0)
    os.close(write_fd)
    chunks = []
    while chunk := os.read(read_fd, 65536):
        chunks.append(chunk)
    os.close(read_fd)
    os.waitpid(pid, 0)
    try:
        got = json.loads(b"".join(chunks) or b"{}")
    except ValueError:
        return {}
    for line in reversed(got.get("lines", []) if isinstance(got, dict) else []):
        try:
            record = json.loads(line)
        except (ValueError, TypeError):
            continue
        if isinstance(record, dict):
            return {"record": record, "mtime": got.get("mtime", 0)}
    return {}


def progress(run_root: str, job: str, metrics: str) -> dict:
    """{step, epoch, loss, at}: the job's newest metrics line, checked; {} when there is none."""
    run_dir = os.path.join(run_root, job)
    try:
        st = os.stat(run_dir, follow_symlinks=False)
    except OSError:
        return {}
    if st.st_uid == 0 or not stat.S_ISDIR(st.st_mode):  # never read a job's files as root
        return {}
    got = last_record(os.path.join(run_dir, metrics), st.st_uid, st.st_gid)
    record = got.get("record", {})
    out = {}
    for key in ("step", "epoch"):
        if isinstance(record.get(key), int) and not isinstance(record.get(key), bool) and record[key] >= 0:
            out[key] = record[key]
    loss = record.get("loss")
    if isinstance(loss, (int, float)) and not isinstance(loss, bool) and math.isfinite(loss):
        out["loss"] = float(loss)
    if out and isinstance(got.get("mtime"), int):
        out["at"] = got["mtime"]
    return out


def main() -> None:
    module = AnsibleModule(
        argument_spec={"config_dir": {"type": "path", "default": "/etc/torchrig/jobs"},
                       "gpus_name": {"type": "str", "required": True},
                       "gpus_dir": {"type": "path", "default": "/proc/driver/nvidia/gpus"},
                       "queue_dir": {"type": "path", "default": "/etc/torchrig/queue"},
                       "run_root": {"type": "str", "default": ""},
                       "metrics": {"type": "str", "required": True}},
        supports_check_mode=True,
    )
    p = module.params

    def run(argv: list[str]) -> str:
        return module.run_command(argv)[1]

    jobs = node_jobs(p["config_dir"], p["gpus_name"], run)
    if p["run_root"]:
        for job in jobs:
            job["progress"] = progress(p["run_root"], job["job"], p["metrics"])
    queue = [{k: e[k] for k in ("at", "job", "want")} for e in queue_entries(p["queue_dir"])]
    module.exit_json(changed=False, jobs=jobs, gpus=count_gpus(p["gpus_dir"]), queue=queue)


if __name__ == "__main__":
    main()
