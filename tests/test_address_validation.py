"""provision.yml and train.yml refuse a cluster address they cannot use before they
connect to any host.

The inventory's hosts point at a closed port on loopback: a run that got past the check
would fail to connect, never change anything. The message names the host, the setting
and what is expected.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run

INVENTORY = """
all:
  children:
    cluster:
      hosts:
        node1: {{ansible_host: 127.0.0.1, ansible_port: 1{node1}}}
        node2: {{ansible_host: 127.0.0.1, ansible_port: 1}}
"""


@pytest.mark.parametrize("node1,expected", [
    (", torchrig_cluster_address: 'fd00::11'",
     "node1: torchrig_cluster_address is the IPv6 address fd00::11. torchrig's training traffic is IPv4 only"),
    (", torchrig_cluster_address: 10.0.0.300",
     "node1: torchrig_cluster_address is '10.0.0.300', not an IPv4 address"),
])
def test_an_unusable_cluster_address_stops_provision_before_any_host_is_touched(
        tmp_path: Path, node1: str, expected: str) -> None:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(INVENTORY.format(node1=node1))
    proc = run(["ansible-playbook", "-i", str(inventory), "provision.yml"], timeout=120)
    out = " ".join(proc.stdout.split())
    assert proc.returncode != 0, proc.stdout
    assert expected in out, proc.stdout
    assert "Nothing was changed." in out
    # Nothing connected: no task of preflight (the first that reaches a host) ran.
    assert "TASK [preflight" not in proc.stdout
    assert "UNREACHABLE" not in proc.stdout


def test_train_refuses_an_ipv6_cluster_address_before_any_host_is_touched(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(INVENTORY.format(node1=", torchrig_cluster_address: '2001:db8::11'"))
    proc = run(["ansible-playbook", "-i", str(inventory), "train.yml", "-e", "nodes=2"], timeout=120)
    out = " ".join(proc.stdout.split())
    assert proc.returncode != 0, proc.stdout
    assert "node1: torchrig_cluster_address is the IPv6 address 2001:db8::11" in out, proc.stdout
    # The torchrun role's first task reads the node; it never ran.
    assert "TASK [torchrun :" not in proc.stdout
    assert "UNREACHABLE" not in proc.stdout
