"""A member node's identity for SSH trust: the training user's home and group,
the node's host keys, and every name and address it answers to.

One definition for both ways the role reads a member (tasks/identity.yml): on
the member itself when it is in the play, and by delegation when it is not
(`provision.yml --limit NEW` updates the old nodes). What a node reports is
untrusted: its values end up in known_hosts and in the cluster key's from="..."
option, where a quote or a comma would change what sshd accepts, so each value
is checked here and a bad one stops the run naming the node.

Plain functions, unit-tested in tests/test_ssh_trust_identity.py; nothing here
imports Ansible.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from typing import Any

# "type base64" of an OpenSSH public key, without its comment.
_HOST_KEY = re.compile(r"(?:ssh|ecdsa|sk)-[A-Za-z0-9@.-]+ [A-Za-z0-9+/]+={0,3}")
# A host name or FQDN as known_hosts and ssh_config take it.
_NAME = re.compile(r"\w(?:[-\w.]{0,252}\w)?", re.ASCII)


def _address(value: str) -> str | None:
    """The address in canonical form, or None when value is not one."""
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        return None


def ssh_trust_identity(
    stdout: str,
    facts: Mapping[str, Any],
    node: str,
    ansible_host: str,
    ignored_names: Iterable[str],
) -> dict[str, Any]:
    """Parse the identity command's output (lines "passwd<TAB>getent line" and
    "hostkey<TAB>public key") and the node's gathered facts into
    {user_found, home, gid, host_keys, addresses, ids}.

    user_found is False when the training user does not exist there (the node
    is not provisioned yet); the caller decides what that means.
    """
    passwd: list[str] = []
    host_keys: list[str] = []
    for line in stdout.splitlines():
        kind, _, value = line.partition("\t")
        if kind == "passwd":
            passwd = value.split(":") if value else []
        elif kind == "hostkey":
            key = " ".join(value.split()[:2])
            if not _HOST_KEY.fullmatch(key):
                raise ValueError(f"{node} reported an SSH host key that is not one: {value[:80]!r}")
            host_keys.append(key)
    user_found = len(passwd) == 7
    if user_found and not passwd[5].startswith("/"):
        raise ValueError(f"{node} reported a home directory that is not an absolute path: {passwd[5][:80]!r}")
    if user_found and not passwd[3].isdigit():
        raise ValueError(f"{node} reported a group id that is not a number: {passwd[3][:80]!r}")

    reported = [str(a) for a in facts.get("all_ipv4_addresses") or []] + [
        str(a) for a in facts.get("all_ipv6_addresses") or [] if not re.match(r"(?i)fe[89ab]", str(a))
    ]
    addresses: list[str] = []
    for value in reported:
        found = _address(value)
        if found is None:
            raise ValueError(f"{node} reported an address that is not one: {value[:80]!r}")
        addresses.append(found)
    # ansible_host is the inventory's, not the node's: an address goes in, a name does not.
    if ansible_host and _address(ansible_host):
        addresses.append(str(_address(ansible_host)))
    # Sorted: the order a node lists its interfaces in can change when it
    # restarts, and known_hosts, from= and the controller's record of it must
    # not change with it.
    addresses = sorted(set(addresses), key=lambda a: ipaddress.ip_address(a).packed.rjust(16, b"\0"))

    ignored = set(ignored_names)
    ids: list[str] = []
    names = [node, ansible_host or node, facts.get("hostname") or "", facts.get("fqdn") or ""]
    for value in map(str, names):
        if not value or value in ignored:
            continue
        if not (_NAME.fullmatch(value) or _address(value)):
            raise ValueError(f"{node}: {value[:80]!r} is not a host name or address")
        ids.append(value)
    ids = list(dict.fromkeys(ids + [a for a in addresses if a not in ignored]))

    return {
        "user_found": user_found,
        "home": passwd[5] if user_found else "",
        "gid": passwd[3] if user_found else "",
        "host_keys": host_keys,
        "addresses": addresses,
        "ids": ids,
    }


class FilterModule:
    def filters(self):
        return {"ssh_trust_identity": ssh_trust_identity}
