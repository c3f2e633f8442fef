"""train.yml checks its request on the controller before touching any host.

The inventory's hosts point at a closed port on loopback: a request that got
past the checks would fail to connect, never start anything. Each case checks
the message names the bad value and what is allowed, and that the play that
starts the job never ran.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run
from rolepy import load

ENV = load("roles/torchrig/filter_plugins/torchrig_contract.py", "torchrig_contract").contract("env")

INVENTORY = """
all:
  children:
    cluster:
      hosts:
        node1: {ansible_host: 127.0.0.1, ansible_port: 1}
        node2: {ansible_host: 127.0.0.1, ansible_port: 1}
"""


@pytest.fixture(scope="module")
def inventory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("inv") / "hosts.yml"
    path.write_text(INVENTORY)
    return path


def train(inventory: Path, *extra: str) -> str:
    proc = run(["ansible-playbook", "-i", str(inventory), "train.yml", *extra], timeout=120)
    assert proc.returncode != 0, proc.stdout
    assert "PLAY [Run the job]" not in proc.stdout, "the job play ran after a bad request"
    assert "No job was started." in proc.stdout
    return " ".join(proc.stdout.split())


def test_more_nodes_than_hosts_names_both_numbers(inventory: Path) -> None:
    out = train(inventory, "-e", "nodes=3")
    assert "nodes=3 but group cluster has 2 provisioned hosts (node1, node2)" in out


@pytest.mark.parametrize("nodes", ["0", "abc", "-1", "1.5", "node1,node9"])
def test_bad_node_request(inventory: Path, nodes: str) -> None:
    out = train(inventory, "-e", f"nodes={nodes}")
    assert "nodes must be a number from 1 to 2 (the hosts of group cluster: node1, node2)" in out
    assert f"got '{nodes}'" in out


@pytest.mark.parametrize("job", ["x;touch /tmp/torchrig-pwned", "$(id)", "a b", "../etc", "-rf", ""])
def test_job_name_with_shell_characters_is_refused(inventory: Path, job: str) -> None:
    # JSON, so that the value reaches Ansible exactly as typed.
    out = train(inventory, "-e", "nodes=2", "-e", json.dumps({"job": job}))
    assert "job must be 1 to 64 letters, digits, '.', '_' or '-'" in out
    assert not Path("/tmp/torchrig-pwned").exists()


@pytest.mark.parametrize(("option", "shown"), [
    ("dataset=imagenet", 'got "imagenet"'),
    ("model=vgg16", 'got "vgg16"'),
    ("epochs=0", '(got "0",'),
    ("batch_size=big", '"big")'),
    ("lr=fast", 'lr a positive number (got "fast")'),
    ("max_restarts=-1", '(got "-1",'),
])
def test_bad_training_option(inventory: Path, option: str, shown: str) -> None:
    out = train(inventory, "-e", "nodes=2", "-e", option)
    assert "Bad training option." in out
    assert shown in out


def test_missing_script(inventory: Path, tmp_path: Path) -> None:
    out = train(inventory, "-e", "nodes=2", "-e", f"script={tmp_path}/nope.py")
    assert f"script={tmp_path}/nope.py does not exist on the controller" in out


@pytest.mark.parametrize("min_nodes", ["0", "3", "abc", "1.5"])
def test_bad_min_nodes_names_the_range(inventory: Path, min_nodes: str) -> None:
    out = train(inventory, "-e", "nodes=2", "-e", f"min_nodes={min_nodes}")
    assert "min_nodes must be a whole number from 1 to the job's 2 nodes" in out
    assert f'got "{min_nodes}"' in out or f"got {min_nodes}" in out


def test_a_host_named_twice_is_refused(inventory: Path) -> None:
    """Two launchers on one host would wait for a node that never comes (join timeout)."""
    out = train(inventory, "-e", "nodes=node1,node1")
    assert "a comma-separated list of them, each once; got 'node1,node1'" in out


@pytest.mark.parametrize("option,value", [("seed", "abc"), ("checkpoint_every", "abc"),
                                          ("seed", "-1"), ("rdzv_port", "abc"), ("rdzv_port", "70000")])
def test_options_that_are_not_whole_numbers_are_refused(inventory: Path, option: str, value: str) -> None:
    """They used to become 0 silently (Jinja's int filter)."""
    out = train(inventory, "-e", "nodes=2", "-e", f"{option}={value}")
    assert "seed and checkpoint_every whole numbers >= 0" in out
    assert "rdzv_port a port of torchrig_rdzv_ports, 29400-29499" in out
    assert f'"{value}"' in out


def test_a_value_split_by_ansible_is_refused_with_the_quoting_to_use(inventory: Path) -> None:
    """`-e extra_args=10 2 --batch_size 32`: Ansible keeps only '10' for extra_args."""
    out = train(inventory, "-e", "nodes=2", "-e", "extra_args=10 2 --batch_size 32")
    assert 'Ansible split an -e value at a space and dropped "2 --batch_size 32"' in out
    assert """-e 'extra_args="10 2 --batch_size 32"'""" in out


@pytest.mark.parametrize(("extra_args", "shown"), [
    ('7 "two words', """extra_args '7 "two words' cannot be split into words: No closing quotation"""),
    (["7", True], "extra_args item 2 is true, not a string or a number; quote it"),
    ({"epochs": 7}, 'extra_args must be a list of strings or one string, got {"epochs": 7}'),
])
def test_bad_extra_args_are_refused(inventory: Path, extra_args: object, shown: str) -> None:
    out = train(inventory, "-e", "nodes=2", "-e", json.dumps({"extra_args": extra_args}))
    assert shown in out
    assert """-e '{"extra_args": ["7", "two words"]}'""" in out


def test_entry_must_be_a_file_inside_the_script_directory(inventory: Path, tmp_path: Path) -> None:
    code = tmp_path / "ddp"
    code.mkdir()
    (code / "multinode.py").write_text("print('entry')\n")
    (tmp_path / "outside.py").write_text("print('outside')\n")
    cases = [
        (["-e", f"script={code}"], f'entry="train.py" must name a file inside the script directory (script={code})'),
        (["-e", f"script={code}", "-e", "entry=../outside.py"], 'entry="../outside.py" must name a file'),
        (["-e", f"script={code}", "-e", "entry=nope.py"], 'entry="nope.py" must name a file'),
        (["-e", "entry=multinode.py"], "(none was given: script=DIR)"),
        (["-e", f"script={tmp_path / 'outside.py'}", "-e", "entry=multinode.py"], ", a file, is not one)"),
    ]
    for extra, shown in cases:
        out = train(inventory, "-e", "nodes=2", *extra)
        assert shown in out, (extra, out)


# --- issue 31, items 6 and 7, through train.yml: refused before the job's play -------------


def test_a_rendezvous_port_the_firewall_does_not_open_is_refused(inventory: Path) -> None:
    out = train(inventory, "-e", "nodes=2", "-e", "rdzv_port=30000")
    assert ('rdzv_port a port of torchrig_rdzv_ports, 29400-29499, which the firewall opens to peers '
            '(got "30000")') in out


def test_the_inventorys_rendezvous_ports_are_the_range(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.yml"
    inv.write_text(INVENTORY + "      vars: {torchrig_rdzv_ports: 30000-30099}\n")
    out = train(inv, "-e", "nodes=2", "-e", "rdzv_port=29400")
    assert "torchrig_rdzv_ports, 30000-30099," in out


def test_a_newline_in_an_env_value_is_refused(inventory: Path) -> None:
    """It would have set the job's entry point in its env file: any command, on every node."""
    out = train(inventory, "-e", "nodes=2", "-e",
                json.dumps({"env": {"A": f"1\n{ENV['entrypoint']}=-c import os; os.system('id')"}}))
    assert "values strings or numbers on one line, without control characters; the value of A" in out


def test_an_env_name_of_the_contract_is_refused(inventory: Path) -> None:
    out = train(inventory, "-e", "nodes=2", "-e", json.dumps({"env": {ENV["entrypoint"]: "-c 1"}}))
    assert f'the name "{ENV["entrypoint"]}" is not one.' in out


@pytest.mark.parametrize(("typed", "shown"), [
    ("epoch=3", "-e epoch is not a setting of train.yml (did you mean epochs?)"),
    ("datset=digits", "-e datset is not a setting of train.yml (did you mean dataset?)"),
])
def test_a_misspelt_name_is_refused(inventory: Path, typed: str, shown: str) -> None:
    """It was ignored: the job trained with the default epochs."""
    out = train(inventory, "-e", "nodes=2", "-e", typed)
    assert shown in out
    assert "train.yml's settings: nodes, job, dataset, model, epochs," in out


def test_a_misspelt_name_in_a_vars_file_is_refused(inventory: Path, tmp_path: Path) -> None:
    extra = tmp_path / "job.yml"
    extra.write_text("nodes: 2\nbatchsize: 64\n")
    out = train(inventory, "-e", f"@{extra}")
    assert "-e batchsize is not a setting of train.yml (did you mean batch_size?)" in out


def test_train_options_are_checked(inventory: Path) -> None:
    out = train(inventory, "-e", "nodes=2", "-e", json.dumps({"train_options": {"epochs": 0}}))
    assert "Bad training option." in out and "Found: epochs must be an integer >= 1, got '0'." in out


def test_a_script_file_name_with_a_space_is_refused(inventory: Path, tmp_path: Path) -> None:
    script = tmp_path / "my train.py"
    script.write_text("print('hi')\n")
    out = train(inventory, "-e", "nodes=2", "-e", json.dumps({"script": str(script)}))
    assert "the file's name \"my train.py\" must be letters, digits" in out


def test_data_neither_on_the_controller_nor_named_is_refused(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.yml"
    inv.write_text(INVENTORY + "      vars: {torchrig_datasets: {cifar: /srv/cifar}}\n")
    out = train(inv, "-e", "nodes=2", "-e", "data=imagenet")
    assert ("data=imagenet is neither a directory or file on the controller nor a name of the inventory's "
            "torchrig_datasets (its names: cifar).") in out


@pytest.mark.parametrize("gpus", ["0", "-1", "half"])
def test_bad_gpus_is_refused_before_any_host(inventory: Path, gpus: str) -> None:
    """Issue 32: -e gpus= is GPUs per node, a whole number from 1, or all."""
    out = train(inventory, "-e", "nodes=2", "-e", f"gpus={gpus}")
    assert "gpus must be the GPUs per node the job holds, a whole number from 1, or all" in out
