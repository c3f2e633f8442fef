"""The torchrun_node module's logic as plain functions: the cluster address's interface
and the GPU count. Kept apart from the module so that tests import them without Ansible
(whose module_utils patch sys.intern, which torch's compiler then refuses).
"""

from __future__ import annotations

import os
import re

NVIDIA_GPUS_DIR = "/proc/driver/nvidia/gpus"
# systemd's ActiveState values of a job unit that holds (or is about to hold, or still
# holds) the job's processes: such a job counts as running.
RUNNING_STATES = ("active", "activating", "deactivating", "reloading")


def job_running(active_state: str | None, ended: dict) -> bool:
    """Whether this node's part of a job still runs.

    A part that has ended for good (`ended`: its fatal.json or ended.json) is over even
    while systemd is still stopping its unit: the stop waits for every process of the
    unit to go, up to TimeoutStopSec (120 s), and was seen to wait that long after the
    job had ended and written why.
    """
    return active_state in RUNNING_STATES and not ended


def parse_addresses(text: str) -> dict[str, str]:
    """{IPv4 address: interface} from `ip -o -4 addr show`."""
    found = {}
    for m in re.finditer(r"^\d+:\s+(\S+?)(?:@\S+)?\s+inet\s+([0-9.]+)/", text, re.MULTILINE):
        found.setdefault(m.group(2), m.group(1))
    return found


def interface_of(address: str, addresses: dict[str, str]) -> str:
    """The interface that holds the cluster address (the torchrig role decided the address),
    or raise ValueError naming what the node has."""
    if address not in addresses:
        raise ValueError(f"no interface holds the cluster address {address or '(none given)'} (this node has "
                         f"{', '.join(sorted(addresses)) or 'no IPv4 address'})")
    return addresses[address]


def count_gpus(gpus_dir: str = NVIDIA_GPUS_DIR) -> int:
    """GPUs the loaded NVIDIA driver sees: one directory per GPU (by PCI address)."""
    try:
        return len([e for e in os.scandir(gpus_dir) if e.is_dir()])
    except OSError:
        return 0


def jobs_hosting_port(envs: dict[str, str], port: int) -> list[str]:
    """The jobs, of those given as {job: its .env text}, that host a rendezvous on `port` here."""
    hosting = []
    for job, text in sorted(envs.items()):
        settings = dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
        endpoint = settings.get("TORCHRIG_RDZV_ENDPOINT", "")
        if settings.get("TORCHRIG_RDZV_IS_HOST") == "1" and endpoint.rpartition(":")[2] == str(port):
            hosting.append(job)
    return hosting
