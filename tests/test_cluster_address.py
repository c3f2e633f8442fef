"""The cluster address rule (roles/torchrig/filter_plugins/torchrig_address.py): the
servers users have (a management network beside a training fabric, DNS names in the
inventory, IPv6 management) and the mistakes they make."""

import pytest
from rolepy import load

addr = load("roles/torchrig/filter_plugins/torchrig_address.py", "torchrig_address")

# A GPU server: SSH on the management network (default route), training on the fabric.
SERVER_FACTS = {"default_ipv4": {"address": "192.0.2.11", "interface": "eno1"},
                "all_ipv4_addresses": ["192.0.2.11", "10.10.0.11", "172.17.0.1"]}


def test_the_training_address_given_wins_over_the_management_one():
    host = {"ansible_host": "192.0.2.11", "torchrig_cluster_address": "10.10.0.11",
            "ansible_facts": SERVER_FACTS}
    assert addr.cluster_address(host, "gpu01") == "10.10.0.11"


def test_ansible_host_when_it_is_an_ip_address():
    assert addr.cluster_address({"ansible_host": "10.89.0.2"}, "node1") == "10.89.0.2"


def test_a_dns_name_in_the_inventory_takes_the_default_route():
    host = {"ansible_host": "gpu01.lab.example", "ansible_facts": SERVER_FACTS}
    assert addr.cluster_address(host, "gpu01") == "192.0.2.11"
    assert addr.needs_route_facts({"ansible_host": "gpu01.lab.example"})
    assert not addr.needs_route_facts(host)
    assert not addr.needs_route_facts({"ansible_host": "10.0.0.1"})
    assert not addr.needs_route_facts({"ansible_host": "gpu01", "torchrig_cluster_address": "10.0.0.1"})


def test_no_ip_and_no_route_asks_for_the_setting():
    with pytest.raises(addr.AddressError,
                       match=r"gpu01: no cluster address.*'gpu01.lab' is not an IP.*"
                             r"Set torchrig_cluster_address.*host_vars/gpu01.yml.*Nothing was changed"):
        addr.cluster_address({"ansible_host": "gpu01.lab", "ansible_facts": {}}, "gpu01")


@pytest.mark.parametrize("host,source", [
    ({"ansible_host": "2001:db8::11"}, "ansible_host"),
    ({"ansible_host": "gpu01", "torchrig_cluster_address": "fd00::11"}, "torchrig_cluster_address"),
])
def test_ipv6_is_refused_by_name_before_any_change(host, source):
    with pytest.raises(addr.AddressError,
                       match=rf"gpu01: {source} is the IPv6 address .*IPv4 only.*Nothing was changed"):
        addr.cluster_address(host, "gpu01")


@pytest.mark.parametrize("bad", ["10.0.0", "10.0.0.256", "gpu01-ib", "10.0.0.1/24"])
def test_an_address_that_is_not_ipv4_is_refused(bad):
    with pytest.raises(addr.AddressError, match=rf"gpu01: torchrig_cluster_address is '{bad}', not an IPv4 address"):
        addr.cluster_address({"torchrig_cluster_address": bad}, "gpu01")


def test_an_address_the_node_does_not_hold_is_refused_naming_what_it_has():
    host = {"torchrig_cluster_address": "10.10.0.12", "ansible_facts": SERVER_FACTS}
    with pytest.raises(addr.AddressError, match=r"no interface of the node holds it \(it has 192.0.2.11, 10.10.0.11"):
        addr.cluster_address(host, "gpu01")
