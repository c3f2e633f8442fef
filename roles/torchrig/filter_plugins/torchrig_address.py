"""The one rule for a node's cluster address: the address its peers use for
training traffic (rendezvous, NCCL, Gloo, the firewall's peer set, /etc/hosts).
Every role and playbook reads the fact the torchrig role sets from it; nothing
else derives an address. Plain functions, unit-tested in tests/test_cluster_address.py.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any


class AddressError(ValueError):
    """A cluster address that cannot be used. Not Ansible's own error class: importing
    Ansible in the test process patches sys.intern, which torch's compiler then refuses."""


NOTHING_CHANGED = "Nothing was changed."


def _ip_version(text: str) -> int:
    """4 or 6 for an IP address literal, 0 for anything else (a DNS name, '')."""
    try:
        return ipaddress.ip_address(text).version
    except ValueError:
        return 0


def _from_inventory(host: Mapping[str, Any]) -> tuple[str, str]:
    """(address, the setting it came from) when the inventory gives it, else ('', '')."""
    given = str(host.get("torchrig_cluster_address") or "").strip()
    if given:
        return given, "torchrig_cluster_address"
    ansible_host = str(host.get("ansible_host") or "").strip()
    if _ip_version(ansible_host):
        return ansible_host, "ansible_host"
    return "", ""


def cluster_address(host: Mapping[str, Any], name: str) -> str:
    """The cluster address of inventory host `name`, from its hostvars `host`.

    The first of: torchrig_cluster_address when set; ansible_host when it is an
    IP address; the address of the node's IPv4 default route (its facts). IPv4
    only: torchrun's --local-addr, the firewall's peer sets and the interface
    pinning are written for IPv4, so an IPv6 address is refused here, before
    any change, rather than half working.
    """
    ansible_host = str(host.get("ansible_host") or "").strip()
    facts = host.get("ansible_facts") or {}
    route = (facts.get("default_ipv4") or {}).get("address", "")
    address, source = _from_inventory(host)
    if not address and route:
        address, source = route, "the address of its default route"
    if not address:
        raise AddressError(
            f"{name}: no cluster address. Its ansible_host '{ansible_host or name}' is not an IP "
            "address and it has no IPv4 default route. Set torchrig_cluster_address to the node's "
            f"IPv4 address on the training network (in host_vars/{name}.yml). {NOTHING_CHANGED}")
    version = _ip_version(address)
    if version == 6:
        raise AddressError(
            f"{name}: {source} is the IPv6 address {address}. torchrig's training traffic is IPv4 "
            "only (torchrun's rendezvous, NCCL/Gloo pinning and the firewall's peer sets). Set "
            f"torchrig_cluster_address to the node's IPv4 address on the training network. {NOTHING_CHANGED}")
    if version != 4:
        raise AddressError(
            f"{name}: {source} is '{address}', not an IPv4 address. Expected four numbers from 0 to "
            f"255 such as 10.0.0.11. {NOTHING_CHANGED}")
    held = facts.get("all_ipv4_addresses")
    if held is not None and address not in held:
        raise AddressError(
            f"{name}: {source} is {address}, but no interface of the node holds it (it has "
            f"{', '.join(held) or 'no IPv4 address'}). Set torchrig_cluster_address to one of its "
            f"addresses on the training network. {NOTHING_CHANGED}")
    return address


def needs_route_facts(host: Mapping[str, Any]) -> bool:
    """Whether the rule above must read the node's default route (no address given)."""
    return not _from_inventory(host)[0] and not (host.get("ansible_facts") or {}).get("default_ipv4")


class FilterModule:
    def filters(self):
        return {
            "torchrig_cluster_address": cluster_address,
            "torchrig_needs_route_facts": needs_route_facts,
        }
