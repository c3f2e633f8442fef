"""Which of the cluster's other nodes train.yml asks about a job of its name
(roles/torchrun/lookup_plugins/torchrun_answering.py): real sockets on this machine, and
the lookup through real Ansible with an inventory of such nodes."""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import run
from rolepy import ROOT

PLUGIN = ROOT / "roles/torchrun/lookup_plugins/torchrun_answering.py"
# The plugin's answering(), in a Python of its own: importing Ansible's plugin classes
# patches sys.intern in the importing process, which breaks torch's compiler for the
# training tests in the same pytest run.
ANSWERING = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("torchrun_answering", sys.argv[1])
plugin = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plugin)
targets = {name: tuple(t) if t else None for name, t in json.loads(sys.argv[2]).items()}
print(json.dumps(plugin.answering(targets, float(sys.argv[3]))))
"""


def answering(targets: dict[str, tuple[str, int] | None], timeout: float) -> list[str]:
    proc = run([sys.executable, "-c", ANSWERING, str(PLUGIN), json.dumps(targets), str(timeout)], check=True)
    return json.loads(proc.stdout)


@pytest.fixture
def listening() -> Iterator[int]:
    """A port on 127.0.0.1 that accepts connections, as a node's sshd does."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock.getsockname()[1]


def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on: a node whose sshd is down."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_only_the_nodes_that_answer_are_kept_in_their_order(listening: int):
    targets = {"node3": ("127.0.0.1", closed_port()), "node1": ("127.0.0.1", listening),
               "node2": None, "node4": ("127.0.0.1", listening)}
    assert answering(targets, 2) == ["node1", "node2", "node4"]


def test_a_node_whose_address_leads_nowhere_is_left_out():
    # TEST-NET-1 (RFC 5737): no host has it; the connection fails or runs out its time.
    assert answering({"gone": ("192.0.2.1", 22)}, 0.5) == []


def test_no_nodes_is_no_probe():
    assert answering({}, 2) == []


PLAY = """
- name: Ask which nodes answer
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Print them
      ansible.builtin.debug:
        msg: "answering={{ query('torchrun_answering', *groups['cluster'], timeout=2) | join(',') }}"
"""


def ask(tmp: Path, hosts: str) -> str:
    (tmp / "hosts.yml").write_text("all:\n  children:\n    cluster:\n      hosts:\n" + hosts)
    (tmp / "play.yml").write_text(PLAY)
    proc = run(["ansible-playbook", "-i", str(tmp / "hosts.yml"), str(tmp / "play.yml")], timeout=120,
               env={"ANSIBLE_LOOKUP_PLUGINS": str(ROOT / "roles/torchrun/lookup_plugins")})
    return proc.stdout + proc.stderr


def test_the_lookup_reads_each_nodes_address_port_and_connection(tmp_path: Path, listening: int):
    out = ask(tmp_path,
              f"        up: {{ansible_host: 127.0.0.1, ansible_port: {listening}}}\n"
              f"        down: {{ansible_host: 127.0.0.1, ansible_port: {closed_port()}}}\n"
              "        here: {ansible_connection: local}\n"
              # Its address from a variable, as inventories often give it.
              f"        templated: {{ansible_host: '{{{{ lo }}}}', ansible_port: {listening}, lo: 127.0.0.1}}\n")
    assert "answering=up,here,templated" in out, out


def test_a_port_that_is_not_a_number_is_named(tmp_path: Path):
    out = ask(tmp_path, "        odd: {ansible_host: 127.0.0.1, ansible_port: ssh}\n")
    assert "odd: ansible_port must be a number, got 'ssh'" in out, out
