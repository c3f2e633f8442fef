"""The torchrun_node module's logic as plain functions: the cluster address, its interface
and the GPU count. Kept apart from the module so that tests import them without Ansible
(whose module_utils patch sys.intern, which torch's compiler then refuses).
"""

from __future__ import annotations

import os
import re

NVIDIA_GPUS_DIR = "/proc/driver/nvidia/gpus"


def parse_default_route(text: str) -> tuple[str, str]:
    """(interface, source address or '') of the first default route in `ip -o -4 route show default`."""
    for line in text.splitlines():
        words = line.split()
        if words[:1] == ["default"] and "dev" in words:
            dev = words[words.index("dev") + 1]
            src = words[words.index("src") + 1] if "src" in words else ""
            return dev, src
    return "", ""


def parse_addresses(text: str) -> dict[str, str]:
    """{IPv4 address: interface} from `ip -o -4 addr show`."""
    found = {}
    for m in re.finditer(r"^\d+:\s+(\S+?)(?:@\S+)?\s+inet\s+([0-9.]+)/", text, re.MULTILINE):
        found.setdefault(m.group(2), m.group(1))
    return found


def pick_address(address: str, addresses: dict[str, str], route: tuple[str, str]) -> tuple[str, str]:
    """(address, interface) for the cluster traffic, or raise ValueError saying what is missing."""
    if address:
        if address not in addresses:
            raise ValueError(f"no interface holds the cluster address {address} (this node has "
                             f"{', '.join(sorted(addresses)) or 'no IPv4 address'})")
        return address, addresses[address]
    dev, src = route
    if not dev:
        raise ValueError("this node has no IPv4 default route: set ansible_host to its cluster address")
    if src and addresses.get(src) == dev:
        return src, dev
    on_dev = [a for a, d in addresses.items() if d == dev]
    if not on_dev:
        raise ValueError(f"the default route's interface {dev} has no IPv4 address")
    return on_dev[0], dev


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
