"""The torchrun_node module's logic (module_utils/torchrun_net.py) on `ip -o -4` output:
node.addr recorded from a local cluster node, server.addr a GPU server's layout written in
the same format.

The module itself runs in every train.yml (the molecule cluster scenario); these
cover the layouts the local cluster does not have: several NICs, docker0, VLANs.
"""

import json
import os

import pytest
import yaml
from conftest import run
from rolepy import FIXTURES, ROOT, load, shared

node = load("roles/torchrun/module_utils/torchrun_net.py", "torchrun_net")
units = shared("torchrun_gpus")
CONTRACT = load("roles/torchrig/filter_plugins/torchrig_contract.py", "torchrig_contract").contract()
ENV, FILES = CONTRACT["env"], CONTRACT["files"]

# A GPU server: a fast cluster NIC without the default route,
# a VLAN, docker0.
SERVER_ADDR = (FIXTURES / "ip" / "server.addr").read_text()
# A local cluster node (podman), as recorded from one.
NODE_ADDR = (FIXTURES / "ip" / "node.addr").read_text()


def test_addresses_name_their_interface_vlans_included():
    assert node.parse_addresses(SERVER_ADDR) == {
        "127.0.0.1": "lo", "192.0.2.11": "eno1", "10.10.0.11": "ens1f0np0",
        "172.20.0.11": "eno1.200", "172.17.0.1": "docker0"}


def test_the_training_address_is_on_the_fast_nic_not_the_default_routes():
    assert node.interface_of("10.10.0.11", node.parse_addresses(SERVER_ADDR)) == "ens1f0np0"
    assert node.interface_of("172.20.0.11", node.parse_addresses(SERVER_ADDR)) == "eno1.200"
    assert node.interface_of("10.89.0.2", node.parse_addresses(NODE_ADDR)) == "eth0"


def test_an_address_no_interface_holds_is_named_with_what_the_node_has():
    with pytest.raises(ValueError, match=r"no interface holds the cluster address 10\.9\.9\.9 "
                                         r"\(this node has 10\.89\.0\.2, 127\.0\.0\.1\)"):
        node.interface_of("10.9.9.9", node.parse_addresses(NODE_ADDR))


def test_gpus_are_counted_from_the_drivers_proc_entries(tmp_path):
    assert units.count_gpus(str(tmp_path / "absent")) == 0
    for bus in ("0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0"):
        (tmp_path / bus).mkdir()
    (tmp_path / "README").write_text("not a GPU")
    assert units.count_gpus(str(tmp_path)) == 3


def env(port: int, is_host: int) -> str:
    return (f"# Job x\n{ENV['rdzv_endpoint']}=10.0.0.1:{port}\n{ENV['rdzv_is_host']}={is_host}\n"
            f"{ENV['nnodes']}=2\n")


def test_a_port_is_taken_only_by_jobs_that_host_their_rendezvous_on_it():
    envs = {"a": env(29417, 1), "b": env(29417, 0), "c": env(29418, 1), "d": "# no endpoint\n"}
    assert node.jobs_hosting_port(envs, 29417, ENV) == ["a"]
    assert node.jobs_hosting_port(envs, 29418, ENV) == ["c"]
    assert node.jobs_hosting_port(envs, 29400, ENV) == []


def test_a_job_that_ended_for_good_is_over_while_systemd_still_stops_its_unit():
    fatal = {"file": FILES["fatal"], "kind": "usage error"}
    assert units.job_running("active", {})
    assert units.job_running("deactivating", {})
    assert not units.job_running("deactivating", fatal)
    assert not units.job_running("active", {"file": FILES["ended"], "kind": "nodes missing"})
    assert not units.job_running("failed", {})
    assert not units.job_running(None, {})


NFT = FIXTURES / "nft"


def nft_sets(*names: str) -> list[str]:
    return [(NFT / f"{name}.json").read_text() for name in names]


def nft_ranges(*names: str) -> list[tuple]:
    """The recorded sets' ranges, as the module reads them before outside_peers."""
    return [r for text in nft_sets(*names) for r in node.nft_set_ranges(text)]


def test_the_firewalls_merged_range_lets_the_cluster_in_and_keeps_the_management_network_out():
    sets = nft_sets("cluster-peers4", "cluster-peers6")
    assert [(str(a), str(b)) for a, b in node.nft_set_ranges(sets[0])] == [("10.89.1.11", "10.89.1.13")]
    assert node.nft_set_ranges(sets[1]) == []
    ranges = nft_ranges("cluster-peers4", "cluster-peers6")
    assert node.outside_peers(["10.89.1.12", "10.89.1.13"], ranges) == []
    # The same nodes by their management addresses (an inventory without the training ones).
    assert node.outside_peers(["10.89.0.12", "10.89.1.12", "10.89.1.14"], ranges) == ["10.89.0.12", "10.89.1.14"]


def test_addresses_prefixes_and_ipv6_peers_are_read():
    ranges = nft_ranges("mixed-p4", "mixed-p6")
    assert node.outside_peers(["10.89.1.11", "192.168.44.5", "fd00::11", "fd00:1::9"], ranges) == []
    assert node.outside_peers(["10.89.1.12", "fd00::12", "fd00:2::1", "192.169.0.1"], ranges) == [
        "10.89.1.12", "fd00::12", "fd00:2::1", "192.169.0.1"]


def test_an_element_with_a_comment_is_read():
    assert node.outside_peers(["10.1.1.1", "10.1.1.2"], nft_ranges("mixed-c4")) == ["10.1.1.2"]


def test_an_ipv4_range_does_not_hold_an_ipv6_address():
    assert node.outside_peers(["::ffff:10.89.1.12"], nft_ranges("cluster-peers4")) == ["::ffff:10.89.1.12"]


def test_an_element_torchrig_does_not_read_is_named():
    text = '{"nftables": [{"set": {"name": "peers4", "elem": [{"set": ["10.0.0.1"]}]}}]}'
    with pytest.raises(ValueError, match=r"an nftables set element torchrig does not read: \{'set'"):
        node.nft_set_ranges(text)


# --- issue 31, item 5: the firewall check fails closed -------------------------------------


def run_module(tmp_path, nft_status: int, **args) -> dict:
    """torchrun_node run by Ansible on this machine, with an `nft` that says whether
    torchrig's table is loaded (exit status 0) or not (1, nft's own message)."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "nft").write_text("#!/bin/sh\n"
                              f"[ {nft_status} = 0 ] || echo 'Error: No such file or directory' >&2\n"
                              f"exit {nft_status}\n")
    (fake / "nft").chmod(0o755)
    module_args = {"address": "127.0.0.1", "venv": str(tmp_path), "unit": "torchrig-job@t.service",
                   "env_names": ENV, **args}
    proc = run(["ansible", "localhost", "-c", "local", "-M", "roles/torchrun/library", "-m", "torchrun_node",
                "-a", json.dumps(module_args)],
               env={"PATH": f"{fake}:{os.environ['PATH']}", "ANSIBLE_MODULE_UTILS": "roles/torchrun/module_utils",
                    "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": "json"}, timeout=120)
    return json.loads(proc.stdout[proc.stdout.index("{"):])["plays"][0]["tasks"][0]["hosts"]["localhost"]


def test_a_node_without_torchrigs_firewall_refuses_the_job(tmp_path):
    """Before, no table meant 'no peers refused' and the job started with its store open
    to anyone who reached the node."""
    result = run_module(tmp_path, 1)
    assert result.get("failed"), result
    assert result["msg"].startswith("This node has no torchrig firewall (nftables table inet torchrig is not "
                                    "loaded; nft says: Error: No such file or directory), so the job's "
                                    "rendezvous store and workers would take connections from anywhere.")
    assert "torchrig_firewall: false. No job was started." in result["msg"]


def test_the_inventory_may_say_another_firewall_guards_the_nodes(tmp_path):
    result = run_module(tmp_path, 1, firewall_required=False)
    assert not result.get("failed"), result
    assert result["firewall_loaded"] is False


def test_a_node_with_torchrigs_firewall_goes_on(tmp_path):
    result = run_module(tmp_path, 0)
    assert not result.get("failed"), result
    assert result["firewall_loaded"] is True and result["interface"] == "lo"


def test_the_role_asks_for_the_firewall_unless_the_inventory_says_it_is_off():
    """torchrun_firewall follows torchrig_firewall (true by default), and the role hands it on."""
    torchrig = yaml.safe_load((ROOT / "roles/torchrig/defaults/main.yml").read_text())
    torchrun = yaml.safe_load((ROOT / "roles/torchrun/defaults/main.yml").read_text())
    tasks = (ROOT / "roles/torchrun/tasks/main.yml").read_text()
    assert torchrig["torchrig_firewall"] is True
    assert torchrun["torchrun_firewall"] == "{{ torchrig_firewall }}"
    assert 'firewall_required: "{{ torchrun_firewall | bool }}"' in tasks


def test_the_job_users_id_comes_with_the_nodes_facts(tmp_path):
    """train.yml makes a job's user only where torchrun_node finds none (tasks/job_user.yml)."""
    import pwd
    me = pwd.getpwuid(os.getuid())
    assert run_module(tmp_path, 0, user=me.pw_name)["user_uid"] == me.pw_uid
    assert run_module(tmp_path, 0, user="tj-no-such-user")["user_uid"] is None
    assert run_module(tmp_path, 0)["user_uid"] is None
