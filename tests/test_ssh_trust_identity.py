"""The ssh_trust role's reading of a member node (roles/ssh_trust/filter_plugins/ssh_trust_identity.py):
what a node reports ends up in known_hosts and in the cluster key's from="..." option, so a value
that is not a key, a name or an address stops the run naming the node."""

import pytest
from rolepy import load

ident = load("roles/ssh_trust/filter_plugins/ssh_trust_identity.py", "ssh_trust_identity")

ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHk0UPH3JmqbtTdDn5a2w6cRMVuKMUEApz2rQkFvZ9Pq"
ECDSA = "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBOn0="
FACTS = {
    "hostname": "node1",
    "fqdn": "node1.example.org",
    "all_ipv4_addresses": ["10.89.0.11", "10.90.0.11"],
    "all_ipv6_addresses": ["fe80::1", "fd00::11"],
}
IGNORED = ["localhost", "localhost.localdomain"]


def stdout(*keys, passwd="torchrig:x:990:990::/home/torchrig:/bin/bash"):
    return "\n".join([f"passwd\t{passwd}"] + [f"hostkey\t{k} root@node1" for k in keys])


def test_a_provisioned_node_gives_its_home_keys_names_and_addresses():
    me = ident.ssh_trust_identity(stdout(ED25519, ECDSA), FACTS, "node1", "10.89.0.11", IGNORED)
    assert me["user_found"] and me["home"] == "/home/torchrig" and me["gid"] == "990"
    assert me["host_keys"] == [ED25519, ECDSA]
    # Link-local IPv6 needs a zone and is left out; ansible_host's address is not repeated.
    assert me["addresses"] == ["10.89.0.11", "10.90.0.11", "fd00::11"]
    assert me["ids"] == ["node1", "10.89.0.11", "node1.example.org", "10.90.0.11", "fd00::11"]


def test_a_node_listing_its_interfaces_in_another_order_gives_the_same_identity():
    # A container restarted (or a server rebooted) may list its networks in another order:
    # known_hosts, from= and the controller's record of the node must not change with it.
    turned = dict(FACTS, all_ipv4_addresses=["10.90.0.11", "10.89.0.11"], all_ipv6_addresses=["fd00::11", "fe80::1"])
    before = ident.ssh_trust_identity(stdout(ED25519), FACTS, "node1", "10.89.0.11", IGNORED)
    after = ident.ssh_trust_identity(stdout(ED25519), turned, "node1", "10.89.0.11", IGNORED)
    assert after == before
    assert after["addresses"] == ["10.89.0.11", "10.90.0.11", "fd00::11"]


def test_a_node_without_the_training_user_is_not_provisioned():
    me = ident.ssh_trust_identity(stdout(ED25519, passwd=""), FACTS, "node3", "node3", IGNORED)
    assert not me["user_found"] and me["home"] == "" and me["host_keys"] == [ED25519]


def test_names_that_never_identify_one_node_are_left_out():
    facts = dict(FACTS, hostname="localhost", fqdn="localhost.localdomain")
    me = ident.ssh_trust_identity(stdout(ED25519), facts, "node1", "node1.mgmt", IGNORED)
    assert "localhost" not in me["ids"] and "localhost.localdomain" not in me["ids"]
    # A name as ansible_host identifies the node but is no address for from=.
    assert "node1.mgmt" in me["ids"] and "node1.mgmt" not in me["addresses"]


@pytest.mark.parametrize(
    ("out", "facts", "said"),
    [
        # A quote would end from="..." and add options of the node's choosing.
        (stdout(ED25519), dict(FACTS, all_ipv4_addresses=['10.0.0.1",command="sh']), "address that is not one"),
        (stdout(ED25519), dict(FACTS, fqdn="node1,*"), "is not a host name or address"),
        (stdout(ED25519), dict(FACTS, hostname="node1\n@cert-authority *"), "is not a host name or address"),
        (stdout("ssh-ed25519 AAAA\"x"), FACTS, "host key that is not one"),
        (stdout("@revoked ssh-ed25519"), FACTS, "host key that is not one"),
        (stdout(ED25519, passwd="torchrig:x:990:990::home:/bin/sh"), FACTS, "not an absolute path"),
        (stdout(ED25519, passwd="torchrig:x:990:wheel::/home/t:/bin/sh"), FACTS, "group id that is not a number"),
    ],
)
def test_a_value_a_node_reports_that_is_not_what_it_should_be_stops_the_run_naming_the_node(out, facts, said):
    with pytest.raises(ValueError, match=said) as raised:
        ident.ssh_trust_identity(out, facts, "node2", "10.89.0.12", IGNORED)
    assert "node2" in str(raised.value)


def test_the_filter_is_registered_under_its_role_name():
    assert ident.FilterModule().filters()["ssh_trust_identity"] is ident.ssh_trust_identity
