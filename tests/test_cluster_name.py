"""torchrig_cluster_name: the cluster's name on the controller, as the torchrig role decides and checks it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import REPO, run

PLAY = """
- name: Name the cluster
  hosts: cluster
  gather_facts: false
  roles: [torchrig]
  tasks:
    - name: Show it
      ansible.builtin.debug:
        msg: "cluster={{ torchrig_cluster }}"
"""


def inventory(directory: Path) -> Path:
    directory.mkdir(parents=True)
    hosts = {"cluster": {"hosts": {"n1": {"ansible_connection": "local", "ansible_python_interpreter": "auto_silent",
                                          "torchrig_cluster_address": "127.0.0.1"}}}}
    (directory / "hosts.yml").write_text(json.dumps(hosts))
    return directory


def name_cluster(tmp_path: Path, inv: Path, *extra: str):
    play = tmp_path / "play.yml"
    play.write_text(PLAY)
    return run(["ansible-playbook", "-i", str(inv), str(play), *extra],
               env={"ANSIBLE_ROLES_PATH": str(REPO / "roles")})


def test_the_default_is_the_inventory_directorys_name(tmp_path):
    done = name_cluster(tmp_path, inventory(tmp_path / "prod"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "msg: cluster=prod" in done.stdout


def test_the_setting_wins(tmp_path):
    done = name_cluster(tmp_path, inventory(tmp_path / "prod"), "-e", "torchrig_cluster_name=lab-2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "msg: cluster=lab-2" in done.stdout


@pytest.mark.parametrize("name", ["a/b", "../up", "-x", "a b", "x" * 65])
def test_a_strange_name_is_refused_before_anything_changes(tmp_path, name):
    done = name_cluster(tmp_path, inventory(tmp_path / "prod"), "-e", json.dumps({"torchrig_cluster_name": name}))
    assert done.returncode != 0
    out = " ".join((done.stdout + done.stderr).split())
    assert f"The cluster's name {json.dumps(name)} (torchrig_cluster_name) must be 1 to 64 letters" in out
    assert "cluster=" not in done.stdout


def test_a_directory_name_that_cannot_be_a_name_says_to_set_it(tmp_path):
    done = name_cluster(tmp_path, inventory(tmp_path / "my cluster"))
    assert done.returncode != 0
    out = " ".join((done.stdout + done.stderr).split())
    assert "The cluster's name \"my cluster\" (the inventory directory" in out
    assert "Set torchrig_cluster_name in the inventory's group_vars" in out
