"""A node's drain before a change that ends its jobs (tasks/drain.yml): which jobs run there,
on which nodes each must be stopped, and the words of the refusal. Unit-tested in
tests/test_torchrun_drain.py.

What the node said (its jobs from the torchrun_jobs module, each job's settings file) is
untrusted input: a job name that is not one is left out, and only node names of this
inventory are ever acted on.
"""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def running_jobs(jobs: Any) -> list[dict[str, Any]]:
    """The jobs systemd says run on the node, as [{job, since}], by name."""
    out = []
    for job in jobs if isinstance(jobs, list) else []:
        if isinstance(job, Mapping) and job.get("running") is True and JOB_NAME.fullmatch(str(job.get("job", ""))):
            since = job.get("since")
            out.append({"job": str(job["job"]),
                        "since": since if isinstance(since, int) and not isinstance(since, bool) and since > 0 else 0})
    return sorted(out, key=lambda j: j["job"])


def refusal(jobs: list[dict[str, Any]], host: str, change: str) -> str:
    """Why the change is refused, what was left alone, and the three ways on."""
    named = ", ".join(
        f"job {j['job']} (running since {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(j['since']))})"
        if j["since"] else f"job {j['job']}" for j in jobs)
    return (f"{host}: {change} would end {named}. Nothing was changed on this node. Let the job end, "
            "stop it (playbooks/stop.yml -e job=NAME), or run again with -e drain=true: each job is "
            "stopped on all its nodes with a checkpoint, and train.yml -e job=NAME with its other "
            "settings resumes it after the change.")


def stop_pairs(reads: Iterable[Any], host: str, inventory: Iterable[str], nodes_name: str) -> list[list[str]]:
    """[node, job] for every drained job and every node of it, this node first.

    `reads` are the slurp results of the jobs' settings files (item.job, content base64);
    a job's nodes are its `nodes_name=node1=addr node2=addr` line. A node the inventory does
    not know is not stopped from here (the job's own end then names it)."""
    known = set(inventory)
    pairs: list[list[str]] = []
    for read in reads:
        job = str(read.get("item", {}).get("job", "")) if isinstance(read, Mapping) else ""
        if not JOB_NAME.fullmatch(job):
            continue
        try:
            text = base64.b64decode(str(read.get("content", ""))).decode("utf-8", "replace")
        except ValueError:
            text = ""
        nodes = []
        for line in text.splitlines():
            if line.startswith(nodes_name + "="):
                nodes = [part.split("=", 1)[0] for part in line[len(nodes_name) + 1:].split()]
        for node in [host] + sorted({n for n in nodes if n in known and n != host}):
            pairs.append([node, job])
    return pairs


def drained(pairs: list[list[str]], host: str, change: str, queue_paused: bool) -> str:
    """What the drain did, job by job."""
    by_job: dict[str, list[str]] = {}
    for node, job in pairs:
        by_job.setdefault(job, []).append(node)
    jobs = "; ".join(f"job {job} on {', '.join(nodes)}" for job, nodes in by_job.items())
    queue = ", and paused the GPU queue here until the change is done" if queue_paused else ""
    return (f"{host}: before {change}, stopped {jobs} with a checkpoint{queue}. Resume each with "
            "train.yml -e job=NAME and its other settings.")


class FilterModule:
    def filters(self):
        return {
            "torchrun_drain_running": running_jobs,
            "torchrun_drain_refusal": refusal,
            "torchrun_drain_pairs": stop_pairs,
            "torchrun_drain_done": drained,
        }
