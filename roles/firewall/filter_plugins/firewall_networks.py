"""Whether an address lies in any of a list of addresses or networks: the
firewall role's check that SSH stays open to the controller (tasks/access.yml).
Plain functions, unit-tested in tests/test_firewall_networks.py; nothing here
imports Ansible (pytest loads this file, see roles/torchrig/filter_plugins/torchrig_address.py).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable


def address_in_networks(address: str, networks: Iterable[str]) -> bool:
    """True when address is in one of networks (addresses count as /32 or /128;
    host bits set are allowed, "10.0.0.5/8" means 10.0.0.0/8). An entry that is
    not an address or network ("any", "peers", a name) matches nothing; an
    address that is not one matches nothing either."""
    try:
        found = ipaddress.ip_address(str(address).strip())
    except ValueError:
        return False
    for network in networks:
        try:
            if found in ipaddress.ip_network(str(network).strip(), strict=False):
                return True
        except ValueError:
            continue
    return False


class FilterModule:
    def filters(self):
        return {"firewall_address_in_networks": address_in_networks}
