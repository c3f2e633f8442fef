"""train.yml's request checks as plain functions
(roles/torchrun_request/filter_plugins/torchrun_request.py), without Ansible: the
settings a good request gives, and the one message a bad one gets.
tests/test_train_validation.py runs the same checks through train.yml."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from rolepy import ROOT, load

req = load("roles/torchrun_request/filter_plugins/torchrun_request.py", "torchrun_request")
HOSTS = ["node1", "node2"]


def refused(values: dict, hosts: list[str] = HOSTS) -> str:
    with pytest.raises(req.RequestError) as e:
        req.request(values, hosts, "cluster")
    message = str(e.value)
    assert message.endswith("No job was started."), message
    return message


def test_defaults_give_every_host_and_the_package_job():
    settings = req.request({}, HOSTS)
    assert settings == {
        "job": "mnist5k-cnn", "nodes": HOSTS, "options": {"dataset": "mnist5k", "model": "cnn"},
        "min_nodes": 0, "rdzv_port": 0, "nproc_per_node": 0, "max_restarts": 3, "script": "",
        "entry": "train.py", "extra_args": [], "wait": True,
    }


def test_options_become_the_packages_flags_with_their_types():
    settings = req.request({"nodes": "1", "dataset": "digits", "epochs": "3", "batch_size": 64, "lr": "1e-3",
                            "seed": "7", "checkpoint_every": "0", "train_options": {"keep-checkpoints": 5},
                            "detach": "yes", "extra_args": '7 "two words"'}, HOSTS)
    assert settings["job"] == "digits-cnn"
    assert settings["nodes"] == ["node1"]
    assert settings["options"] == {"dataset": "digits", "model": "cnn", "epochs": 3, "batch-size": 64, "lr": 0.001,
                                   "seed": 7, "checkpoint-every": 0, "keep-checkpoints": 5}
    assert settings["wait"] is False
    assert settings["extra_args"] == ["7", "two words"]


def test_hosts_named_keep_their_order():
    assert req.request({"nodes": "node2, node1"}, HOSTS)["nodes"] == ["node2", "node1"]


@pytest.mark.parametrize("nodes", ["0", "abc", "-1", "1.5", "node1,node9", "node1,node1"])
def test_bad_nodes_name_the_hosts_and_the_value(nodes):
    message = refused({"nodes": nodes})
    assert message.startswith("nodes must be a number from 1 to 2 (the hosts of group cluster: node1, node2)")
    assert f"got '{nodes}'" in message


def test_no_hosts_says_how_to_start_some():
    assert "(the hosts of group cluster: none; start some with make up)" in refused({}, [])


def test_more_nodes_than_hosts():
    assert refused({"nodes": 3}).startswith("nodes=3 but group cluster has 2 provisioned hosts (node1, node2).")


@pytest.mark.parametrize("job", ["x;touch /tmp/x", "$(id)", "a b", "../etc", "-rf", "", "a" * 65, "abc\n"])
def test_job_names_that_are_not_unit_names_are_refused(job):
    assert refused({"job": job}).startswith("job must be 1 to 64 letters, digits, '.', '_' or '-'")


def test_the_job_name_rule_is_the_torchrig_roles():
    defaults = yaml.safe_load((ROOT / "roles/torchrig/defaults/main.yml").read_text())
    assert req.job_name_pattern() == defaults["torchrig_job_name_pattern"]
    assert req.request({"job": "a" * 64}, HOSTS)["job"] == "a" * 64


@pytest.mark.parametrize(("values", "shown"), [
    ({"dataset": "imagenet"}, '(got "imagenet")'),
    ({"model": "vgg16"}, '(got "vgg16")'),
    ({"epochs": "0"}, '(got "0", "default")'),
    ({"batch_size": "big"}, '(got "default", "big")'),
    ({"lr": "fast"}, 'lr a positive number (got "fast")'),
    ({"lr": "0"}, 'lr a positive number (got "0")'),
    ({"seed": "-1"}, '(got "-1", "default")'),
    ({"checkpoint_every": "abc"}, '(got "default", "abc")'),
    ({"rdzv_port": "70000"}, 'rdzv_port a port number (got "70000")'),
    ({"max_restarts": "-1"}, '(got "-1", "default")'),
    ({"nproc_per_node": "two"}, '(got "default", "two")'),
    ({"detach": "maybe"}, "detach true or false"),
])
def test_a_bad_training_option_names_every_option_and_what_is_allowed(values, shown):
    message = refused(values)
    assert message.startswith("Bad training option. Allowed: dataset one of mnist5k, digits, synthetic, mnist, "
                              "fashion-mnist, cifar10 (got ")
    assert "model cnn or resnet18" in message
    assert shown in message


def test_the_allowed_datasets_and_models_are_the_packages():
    config = req.training_config()
    message = refused({"dataset": "imagenet"})
    assert f"dataset one of {', '.join(config.DATASETS)} " in message
    assert all(model in message for model in config.MODELS)


def test_the_options_are_checked_by_the_packages_check_settings(monkeypatch):
    config = req.training_config()
    seen = []

    def check_settings(values):
        seen.append(dict(values))
        return ["epochs must be an integer >= 7, got '3'"] if "epochs" in values else []

    monkeypatch.setattr(config, "check_settings", check_settings)
    assert refused({"epochs": "3"}).startswith("Bad training option.")
    assert seen[-1] == {"dataset": "mnist5k", "model": "cnn", "epochs": "3"}
    assert req.request({"seed": "3"}, HOSTS)["options"]["seed"] == 3


@pytest.mark.parametrize("min_nodes", ["0", "3", "abc", "1.5"])
def test_bad_min_nodes_names_the_range(min_nodes):
    message = refused({"min_nodes": min_nodes})
    assert message.startswith("min_nodes must be a whole number from 1 to the job's 2 nodes")
    assert f'got "{min_nodes}"' in message


def test_min_nodes_counts_the_selected_nodes():
    assert req.request({"nodes": "2", "min_nodes": "1"}, HOSTS)["min_nodes"] == 1
    assert "from 1 to the job's 1 nodes" in refused({"nodes": "1", "min_nodes": "2"})


def test_a_missing_script(tmp_path: Path):
    assert refused({"script": f"{tmp_path}/nope.py"}) == (
        f"script={tmp_path}/nope.py does not exist on the controller. No job was started.")


def test_a_script_directory_and_its_entry_file(tmp_path: Path):
    code = tmp_path / "ddp"
    (code / "pkg").mkdir(parents=True)
    (code / "pkg" / "main.py").write_text("print('entry')\n")
    (tmp_path / "outside.py").write_text("print('outside')\n")
    settings = req.request({"script": str(code), "entry": "pkg/main.py"}, HOSTS)
    assert (settings["script"], settings["entry"]) == (str(code), "pkg/main.py")
    assert f'entry="train.py" must name a file inside the script directory (script={code})' in refused(
        {"script": str(code)})
    assert 'entry="../outside.py" must name a file' in refused({"script": str(code), "entry": "../outside.py"})
    assert "(none was given: script=DIR)" in refused({"entry": "main.py"})
    assert ", a file, is not one)" in refused({"script": str(tmp_path / "outside.py"), "entry": "main.py"})


def test_a_script_file_needs_no_entry(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    assert req.request({"script": str(script)}, HOSTS)["script"] == str(script)


def test_the_entry_rule_is_the_torchrun_roles():
    torchrun_vars = yaml.safe_load((ROOT / "roles/torchrun/vars/main.yml").read_text())
    assert req.entry_pattern() == torchrun_vars["_torchrun_entry_pattern"]


@pytest.mark.parametrize(("extra_args", "shown"), [
    ('7 "two words', """extra_args '7 "two words' cannot be split into words: No closing quotation"""),
    (["7", True], "extra_args item 2 is true, not a string or a number; quote it"),
    ({"epochs": 7}, 'extra_args must be a list of strings or one string, got {"epochs": 7}'),
])
def test_bad_extra_args_say_how_to_write_them(extra_args, shown):
    message = refused({"extra_args": extra_args})
    assert message.startswith(shown + ". extra_args is a YAML/JSON list")
    assert """-e '{"extra_args": ["7", "two words"]}'""" in message
    assert r"""-e 'extra_args="7 \"two words\""'""" in message


def test_a_value_ansible_split_comes_first():
    message = refused({"_raw_params": "2 --batch_size 32", "nodes": "abc"})
    assert message.startswith('Ansible split an -e value at a space and dropped "2 --batch_size 32"')


def test_the_first_failing_check_is_the_one_reported():
    assert refused({"nodes": "abc", "job": "a b", "epochs": "0"}).startswith("nodes must be")
    assert refused({"job": "a b", "epochs": "0"}).startswith("job must be")
    assert refused({"epochs": "0", "min_nodes": "9"}).startswith("Bad training option.")


def test_train_options_must_be_a_mapping():
    assert "train_options must be a mapping" in refused({"train_options": ["epochs", 3]})


@pytest.mark.parametrize(("job", "problem"), [
    ("mnist5k-cnn", ""),
    (None, """Pass the job's name: -e job=NAME (letters, digits, '.', '_', '-'); got "nothing"."""),
    ("", """Pass the job's name: -e job=NAME (letters, digits, '.', '_', '-'); got ""."""),
    ("a;b", """Pass the job's name: -e job=NAME (letters, digits, '.', '_', '-'); got "a;b"."""),
])
def test_the_job_name_of_status_logs_and_stop(job, problem):
    assert req.job_name_problem(job) == problem


def test_the_job_name_pattern_has_one_copy_among_the_playbooks_and_roles():
    """The rule lives in roles/torchrig/defaults/main.yml (and its argument spec's default)."""
    literal = re.escape("A-Za-z0-9_.-")
    found = sorted(str(p.relative_to(ROOT)) for pattern in ("*.yml", "playbooks/*.yml", "roles/**/*.yml",
                                                            "roles/**/*.py", "roles/**/*.j2")
                   for p in ROOT.glob(pattern) if re.search(literal, p.read_text()))
    assert found == ["roles/torchrig/defaults/main.yml", "roles/torchrig/meta/argument_specs.yml"]


@pytest.mark.parametrize("role", ["torchrun", "torchrun_request", "health"])
def test_every_option_shows_its_default_as_defaults_main_gives_it(role):
    """ansible-doc -t role shows each option's default: the argument spec's, which must be
    the value defaults/main.yml gives; and every default is an option."""
    specs = yaml.safe_load((ROOT / f"roles/{role}/meta/argument_specs.yml").read_text())["argument_specs"]
    defaults = yaml.safe_load((ROOT / f"roles/{role}/defaults/main.yml").read_text())
    for entry, spec in specs.items():
        for name, option in spec["options"].items():
            assert "default" in option, (entry, name)
            assert option["default"] == defaults[name], (entry, name)
    assert set(defaults) == set(specs["main"]["options"]) | {
        name for spec in specs.values() for name in spec["options"]}
