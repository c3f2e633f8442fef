"""The firewall role's controller check (roles/firewall/filter_plugins/firewall_networks.py):
the role stops before loading a ruleset whose SSH sources leave out the address
Ansible's own session comes from."""

from rolepy import load

nets = load("roles/firewall/filter_plugins/firewall_networks.py", "firewall_networks")


def test_an_address_in_a_network_or_equal_to_an_address():
    assert nets.address_in_networks("10.89.0.1", ["192.0.2.0/24", "10.89.0.0/16"])
    assert nets.address_in_networks("198.51.100.7", ["198.51.100.7"])
    assert nets.address_in_networks("2001:db8::5", ["2001:db8::/32"])


def test_host_bits_set_count_as_the_network():
    assert nets.address_in_networks("10.1.2.3", ["10.0.0.5/8"])


def test_an_address_outside_every_source_is_refused():
    assert not nets.address_in_networks("10.89.0.1", ["192.0.2.0/24", "2001:db8::/32"])
    assert not nets.address_in_networks("10.89.0.1", [])


def test_ipv4_never_matches_an_ipv6_network():
    assert not nets.address_in_networks("10.89.0.1", ["::/0"])


def test_entries_that_are_not_networks_match_nothing():
    assert not nets.address_in_networks("10.89.0.1", ["peers", "any", "node1"])
    assert nets.address_in_networks("10.89.0.1", ["bogus", "10.89.0.0/24"])
    assert not nets.address_in_networks("not-an-address", ["0.0.0.0/0"])


def test_the_filter_is_registered_under_its_role_name():
    assert nets.FilterModule().filters()["firewall_address_in_networks"] is nets.address_in_networks
