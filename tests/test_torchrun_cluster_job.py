"""One job name, one job, cluster-wide (issue 31, item 9): the torchrun role asks every
node of the cluster, not only the job's own, whether a job of that name runs there
(roles/torchrun/tasks/cluster_job.yml, with the role's torchrun_job_state module).

Real Ansible, local connections: three inventory hosts on this machine, each with its own
`systemctl` (this container has no systemd), which says the job's unit is active or not.
Before, only the job's own nodes were asked, and a second job of the same name on other
nodes started and wrote the same runs/<job>/.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
from conftest import run
from rolepy import ROOT

PLAY = """
- name: The torchrun role's cluster-wide check, on the job's nodes
  hosts: job
  gather_facts: false
  vars_files:
    - {root}/roles/torchrig/defaults/main.yml
    - {root}/roles/torchrun/defaults/main.yml
    - {root}/roles/torchrun/vars/main.yml
    # The job's own settings, after the role's defaults.
    - {tmp}/job.yml
  tasks:
    - name: Check the cluster
      ansible.builtin.include_tasks: {root}/roles/torchrun/tasks/cluster_job.yml
    - name: Reached only when no other node runs the job
      ansible.builtin.debug:
        msg: no other node runs it
"""


def node(tmp: Path, name: str, state: str) -> str:
    """An inventory line for a local host whose systemctl reports `state` for any unit."""
    bin_dir = tmp / name / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "systemctl").write_text(
        f"#!/bin/sh\nprintf 'ActiveState={state}\\nSubState=running\\nResult=success\\nNRestarts=0\\n"
        "StateChangeTimestamp=\\n'\n")
    (bin_dir / "systemctl").chmod(0o755)
    python = tmp / name / "python"
    python.write_text(f'#!/bin/sh\nPATH="{bin_dir}:$PATH" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return f"        {name}: {{ansible_connection: local, ansible_python_interpreter: {python}}}\n"


def down_node(name: str) -> str:
    """An inventory line for a node that is down: SSH to a local port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"        {name}: {{ansible_host: 127.0.0.1, ansible_port: {port}}}\n"


def check(tmp: Path, states: dict[str, str], down: tuple[str, ...] = ()) -> str:
    """Run the check for a job on node1; `states`: each host's unit state; `down`: nodes that are off."""
    inventory = tmp / "hosts.yml"
    inventory.write_text("all:\n  children:\n    cluster:\n      hosts:\n"
                         + "".join(node(tmp, name, state) for name, state in states.items())
                         + "".join(down_node(name) for name in down)
                         + "    job:\n      hosts:\n        node1:\n")
    (tmp / "job.yml").write_text(f"torchrun_job: same-name\ntorchrun_run_root: {tmp}/runs\n")
    play = tmp / "play.yml"
    play.write_text(PLAY.format(root=ROOT, tmp=tmp))
    proc = run(["ansible-playbook", "-i", str(inventory), str(play)], timeout=180,
               env={"ANSIBLE_LIBRARY": str(ROOT / "roles/torchrun/library"),
                    "ANSIBLE_MODULE_UTILS": str(ROOT / "roles/torchrun/module_utils"),
                    "ANSIBLE_LOOKUP_PLUGINS": str(ROOT / "roles/torchrun/lookup_plugins"),
                    "ANSIBLE_FILTER_PLUGINS": str(ROOT / "roles/torchrig/filter_plugins")})
    return " ".join((proc.stdout + proc.stderr).split())


def test_a_job_of_the_same_name_on_another_node_refuses_the_job(tmp_path: Path):
    out = check(tmp_path, {"node1": "inactive", "node2": "active", "node3": "inactive"})
    assert ("Job same-name already runs on node2, outside this job's nodes (node1): one job name is one job "
            "across the cluster (its results go to runs/same-name/).") in out
    assert "No job was started." in out
    assert "no other node runs it" not in out


@pytest.mark.parametrize("state", ["activating", "deactivating"])
def test_a_job_between_restarts_counts_as_running(tmp_path: Path, state: str):
    out = check(tmp_path, {"node1": "inactive", "node2": "inactive", "node3": state})
    assert "Job same-name already runs on node3, outside this job's nodes (node1)" in out


def test_no_job_elsewhere_goes_on(tmp_path: Path):
    out = check(tmp_path, {"node1": "inactive", "node2": "inactive", "node3": "failed"})
    assert "no other node runs it" in out, out


def test_a_node_that_is_down_is_not_asked_and_the_job_goes_on(tmp_path: Path):
    # A node powered off in the middle of a cluster's life (the cluster scenario's f-elastic
    # kills node3): asking it failed the whole train.yml with "No route to host".
    out = check(tmp_path, {"node1": "inactive", "node2": "inactive"}, down=("node3",))
    assert "no other node runs it" in out, out


def test_a_node_that_is_down_does_not_hide_a_job_on_another(tmp_path: Path):
    out = check(tmp_path, {"node1": "inactive", "node2": "active"}, down=("node3",))
    assert "Job same-name already runs on node2, outside this job's nodes (node1)" in out, out
