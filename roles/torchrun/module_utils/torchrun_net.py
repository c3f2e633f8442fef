"""The torchrun_node module's logic as plain functions: the cluster address's interface,
the firewall's peers, the jobs on a port (the GPU count and the units' states are in
torchrun_gpus.py). Kept apart from the module so that tests import them
without Ansible (whose module_utils patch sys.intern, which torch's compiler then refuses).
"""

from __future__ import annotations

import ipaddress
import json
import re


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


def jobs_hosting_port(envs: dict[str, str], port: int, names: dict[str, str]) -> list[str]:
    """The jobs, of those given as {job: its .env text}, that host a rendezvous on `port` here.
    `names`: the job contract's environment names (rdzv_endpoint, rdzv_is_host)."""
    hosting = []
    for job, text in sorted(envs.items()):
        settings = dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
        endpoint = settings.get(names["rdzv_endpoint"], "")
        if settings.get(names["rdzv_is_host"]) == "1" and endpoint.rpartition(":")[2] == str(port):
            hosting.append(job)
    return hosting


def nft_set_ranges(text: str) -> list[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address,
                                            ipaddress.IPv4Address | ipaddress.IPv6Address]]:
    """(first, last) address of each element of an nftables set, from `nft -j list set`.

    nft gives an element as an address, a prefix or a range (an interval set with
    auto-merge joins neighbours into ranges: 10.0.0.11, .12 and .13 come back as one).
    """
    ranges = []
    for item in json.loads(text).get("nftables", []):
        for entry in item.get("set", {}).get("elem", []):
            # An element with a comment or a timeout is nested one level deeper.
            elem = entry["elem"]["val"] if isinstance(entry, dict) and "elem" in entry else entry
            if isinstance(elem, str):
                first = last = ipaddress.ip_address(elem)
            elif "prefix" in elem:
                net = ipaddress.ip_network(f"{elem['prefix']['addr']}/{elem['prefix']['len']}", strict=False)
                first, last = net[0], net[-1]
            elif "range" in elem:
                first, last = (ipaddress.ip_address(a) for a in elem["range"])
            else:
                raise ValueError(f"an nftables set element torchrig does not read: {elem!r}")
            ranges.append((first, last))
    return ranges


def outside_peers(addresses: list[str], ranges: list[tuple]) -> list[str]:
    """The addresses, of those given, that no range of the firewall's peer sets holds
    (nft_set_ranges of each set): peers the firewall keeps out."""
    outside = []
    for address in addresses:
        ip = ipaddress.ip_address(address)
        if not any(first.version == ip.version and first <= ip <= last for first, last in ranges):
            outside.append(address)
    return outside
