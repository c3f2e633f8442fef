"""CPU seconds spent by the local cluster's nodes and by the rest of the machine.

On a 2-core machine that runs the controller and every node, a wall time says
little on its own: the CPU seconds behind it tell whether a run was CPU-bound,
and whether the work per node stays flat as nodes are added. Nodes are read
from their containers' cgroups; "controller" is every other busy CPU second
of the machine (Ansible, ssh, rsync, and anything else running), so the
benches are meant for an otherwise idle machine.
"""

from __future__ import annotations

import os
import resource
import subprocess
from dataclasses import dataclass
from pathlib import Path

CLUSTER_PREFIX = "torchrig-"
CGROUP = Path("/sys/fs/cgroup")


def machine_busy_s() -> float:
    """Busy CPU seconds of the whole machine since boot (all of /proc/stat but idle and iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def run_cpu_s(argv: list[str], **kwargs: object) -> float:
    """Run argv to its end (output captured, a failure raised) and return the CPU seconds it and its
    children took, read from this process's rusage of ended children."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, capture_output=True, check=True, **kwargs)  # type: ignore[call-overload]
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def cgroup_usage_file(container: str) -> Path:
    """The file that counts a container's CPU time: cgroup v1 cpuacct.usage or v2 cpu.stat."""
    path = subprocess.run(["podman", "inspect", "--format", "{{.State.CgroupPath}}", container],
                          capture_output=True, text=True, check=True).stdout.strip().lstrip("/")
    v1 = CGROUP / "cpuacct" / path / "cpuacct.usage"
    return v1 if v1.exists() else CGROUP / path / "cpu.stat"


def cgroup_cpu_s(usage_file: Path) -> float:
    """CPU seconds counted in a cgroup v1 cpuacct.usage (ns) or v2 cpu.stat (usage_usec)."""
    text = usage_file.read_text()
    if usage_file.name == "cpuacct.usage":
        return int(text) / 1e9
    return int(dict(line.split() for line in text.splitlines())["usage_usec"]) / 1e6


@dataclass
class CpuUse:
    """CPU seconds between two readings: each node's, and the rest of the machine's."""

    nodes: dict[str, float]
    controller: float

    @property
    def per_node(self) -> float:
        return sum(self.nodes.values()) / len(self.nodes) if self.nodes else 0.0

    @property
    def total(self) -> float:
        return self.controller + sum(self.nodes.values())


class CpuMeter:
    """Reads the machine and the named nodes now; `used()` gives the CPU spent since."""

    def __init__(self, nodes: list[str]) -> None:
        # Found once: a podman call per reading would sit between the nodes' and the machine's.
        self.usage_files = {n: cgroup_usage_file(CLUSTER_PREFIX + n) for n in nodes}
        self.start_machine = machine_busy_s()
        self.start_nodes = {n: cgroup_cpu_s(f) for n, f in self.usage_files.items()}

    def used(self) -> CpuUse:
        nodes = {n: cgroup_cpu_s(f) - self.start_nodes[n] for n, f in self.usage_files.items()}
        machine = machine_busy_s() - self.start_machine
        return CpuUse(nodes, max(machine - sum(nodes.values()), 0.0))
