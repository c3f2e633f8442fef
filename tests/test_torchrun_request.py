"""train.yml's request checks as plain functions
(roles/torchrun_request/filter_plugins/torchrun_request.py), without Ansible: the
settings a good request gives, and the one message a bad one gets.
tests/test_train_validation.py runs the same checks through train.yml."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from conftest import as_unprivileged
from rolepy import ROOT, load

req = load("roles/torchrun_request/filter_plugins/torchrun_request.py", "torchrun_request")
ENV = load("roles/torchrig/filter_plugins/torchrig_contract.py", "torchrig_contract").contract("env")
HOSTS = ["node1", "node2"]


def refused(values: dict, hosts: list[str] = HOSTS) -> str:
    with pytest.raises(req.RequestError) as e:
        req.request(values, hosts, "cluster")
    message = str(e.value)
    assert message.endswith("No job was started."), message
    return message


def settings(values: dict, hosts: list[str] = HOSTS, **kwargs) -> dict:
    """The torchrun role's settings the request gives, by the role's own names."""
    return req.request(values, hosts, "cluster", **kwargs)["vars"]


def test_defaults_give_every_host_and_the_package_job():
    """What was not given is not in the settings: the torchrun role's defaults fill it in,
    so each default lives in roles/torchrun/defaults/main.yml only."""
    decided = req.request({}, HOSTS, "cluster")
    assert decided == {"nodes": HOSTS, "vars": {
        "torchrun_job": "mnist5k-cnn", "torchrun_nnodes": 2, "torchrun_rdzv_node": "node1",
        "torchrun_train_options": {"dataset": "mnist5k", "model": "cnn"},
    }}


def test_the_torchrun_defaults_take_the_requests_values_else_their_own():
    """Each torchrun setting train.yml may give reads torchrun_settings first, then its one
    default; max_restarts' 3 is written there only."""
    torchrun = yaml.safe_load((ROOT / "roles/torchrun/defaults/main.yml").read_text())
    assert torchrun["torchrun_settings"] == {}
    for name in {v for v in req.NAMES.values() if v} | {"torchrun_rdzv_node"}:
        assert torchrun[name].startswith(f"{{{{ torchrun_settings.{name} | default("), name
    assert req.torchrun_default("torchrun_max_restarts") == 3
    assert req.torchrun_default("torchrun_script_entry") == "train.py"
    literal_3 = sorted(str(p.relative_to(ROOT)) for p in [*(ROOT / "roles").glob("*/*/*.*"), ROOT / "train.yml"]
                       if p.suffix in (".yml", ".py") and re.search(r"max_restarts\W+(default\()?3\b", p.read_text()))
    assert literal_3 == ["roles/torchrun/defaults/main.yml", "roles/torchrun/meta/argument_specs.yml"], literal_3


def test_what_was_given_is_handed_on():
    got = settings({"min_nodes": "1", "rdzv_port": "29410", "nproc_per_node": "2", "max_restarts": "0",
                    "detach": "true", "extra_args": ["a"], "env": {"A": 1}, "results_dir": "/r"})
    assert {k: v for k, v in got.items() if k not in ("torchrun_job", "torchrun_nnodes", "torchrun_rdzv_node",
                                                      "torchrun_train_options")} == {
        "torchrun_min_nodes": 1, "torchrun_rdzv_port": 29410, "torchrun_nproc_per_node": 2,
        "torchrun_max_restarts": 0, "torchrun_wait": False, "torchrun_extra_args": ["a"],
        "torchrun_env": {"A": "1"}, "torchrun_fetch_dir": "/r/mnist5k-cnn"}


def test_every_train_yml_name_sets_a_torchrun_variable_the_role_declares():
    specs = yaml.safe_load((ROOT / "roles/torchrun/meta/argument_specs.yml").read_text())
    declared = set(specs["argument_specs"]["main"]["options"])
    assert {v for v in req.NAMES.values() if v} <= declared


def test_options_become_the_packages_flags_with_their_types():
    decided = req.request({"nodes": "1", "dataset": "digits", "epochs": "3", "batch_size": 64, "lr": "1e-3",
                           "seed": "7", "checkpoint_every": "0", "train_options": {"keep-checkpoints": 5},
                           "detach": "yes", "extra_args": '7 "two words"', "results_dir": "/r"}, HOSTS)
    assert decided["nodes"] == ["node1"]
    got = decided["vars"]
    assert (got["torchrun_job"], got["torchrun_nnodes"], got["torchrun_rdzv_node"]) == ("digits-cnn", 1, "node1")
    assert got["torchrun_train_options"] == {"dataset": "digits", "model": "cnn", "epochs": 3, "batch-size": 64,
                                             "lr": 0.001, "seed": 7, "checkpoint-every": 0, "keep-checkpoints": 5}
    assert got["torchrun_wait"] is False
    assert got["torchrun_extra_args"] == ["7", "two words"]
    assert got["torchrun_fetch_dir"] == "/r/digits-cnn"


def test_hosts_named_keep_their_order():
    assert req.request({"nodes": "node2, node1"}, HOSTS)["nodes"] == ["node2", "node1"]
    assert settings({"nodes": "node2, node1"})["torchrun_rdzv_node"] == "node2"


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
    assert settings({"job": "a" * 64})["torchrun_job"] == "a" * 64


@pytest.mark.parametrize(("values", "shown"), [
    ({"dataset": "imagenet"}, '(got "imagenet")'),
    ({"model": "vgg16"}, '(got "vgg16")'),
    ({"epochs": "0"}, '(got "0", "default")'),
    ({"batch_size": "big"}, '(got "default", "big")'),
    ({"lr": "fast"}, 'lr a positive number (got "fast")'),
    ({"lr": "0"}, 'lr a positive number (got "0")'),
    ({"seed": "-1"}, '(got "-1", "default")'),
    ({"checkpoint_every": "abc"}, '(got "default", "abc")'),
    ({"rdzv_port": "70000"}, 'rdzv_port a port of torchrig_rdzv_ports, 29400-29499, which the firewall '
                             'opens to peers (got "70000")'),
    ({"max_restarts": "-1"}, '(got "-1", "default")'),
    ({"nproc_per_node": "two"}, '(got "default", "two")'),
    ({"detach": "maybe"}, "detach and fetch_checkpoints true or false"),
])
def test_a_bad_training_option_names_every_option_and_what_is_allowed(values, shown):
    message = refused(values)
    assert message.startswith("Bad training option. Allowed: dataset one of mnist5k, digits, synthetic, mnist, "
                              "fashion-mnist, cifar10, imagefolder (got ")
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
    assert settings({"seed": "3"})["torchrun_train_options"]["seed"] == 3


@pytest.mark.parametrize("min_nodes", ["0", "3", "abc", "1.5"])
def test_bad_min_nodes_names_the_range(min_nodes):
    message = refused({"min_nodes": min_nodes})
    assert message.startswith("min_nodes must be a whole number from 1 to the job's 2 nodes")
    assert f'got "{min_nodes}"' in message


def test_min_nodes_counts_the_selected_nodes():
    assert settings({"nodes": "2", "min_nodes": "1"})["torchrun_min_nodes"] == 1
    assert "from 1 to the job's 1 nodes" in refused({"nodes": "1", "min_nodes": "2"})


def test_a_missing_script(tmp_path: Path):
    assert refused({"script": f"{tmp_path}/nope.py"}) == (
        f"script={tmp_path}/nope.py does not exist on the controller. No job was started.")


def test_a_script_directory_and_its_entry_file(tmp_path: Path):
    code = tmp_path / "ddp"
    (code / "pkg").mkdir(parents=True)
    (code / "pkg" / "main.py").write_text("print('entry')\n")
    (tmp_path / "outside.py").write_text("print('outside')\n")
    got = settings({"script": str(code), "entry": "pkg/main.py"})
    assert (got["torchrun_script"], got["torchrun_script_entry"]) == (str(code), "pkg/main.py")
    assert f'entry="train.py" must name a file inside the script directory (script={code})' in refused(
        {"script": str(code)})
    assert 'entry="../outside.py" must name a file' in refused({"script": str(code), "entry": "../outside.py"})
    assert "(none was given: script=DIR)" in refused({"entry": "main.py"})
    assert ", a file, is not one)" in refused({"script": str(tmp_path / "outside.py"), "entry": "main.py"})


def test_a_script_file_needs_no_entry(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    assert settings({"script": str(script)})["torchrun_script"] == str(script)


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


# --- issue 31: every name and value given is checked, with full matches, before any host ---


@pytest.mark.parametrize("port", ["29399", "29500", "30000", "1", "65535"])
def test_a_rendezvous_port_outside_the_firewalls_range_is_refused(port):
    """Item 6: the firewall opens torchrig_rdzv_ports only; any other port ended in a join
    timeout. Before: any port 1-65535 passed."""
    assert f'which the firewall opens to peers (got "{port}")' in refused({"rdzv_port": port})


def test_the_rendezvous_range_is_the_inventorys_setting():
    assert settings({"rdzv_port": "30010"}, rdzv_ports="30000-30099")["torchrun_rdzv_port"] == 30010
    assert "torchrig_rdzv_ports, 30000-30099," in refused_with({"rdzv_port": "29400"}, rdzv_ports="30000-30099")
    defaults = yaml.safe_load((ROOT / "roles/torchrig/defaults/main.yml").read_text())
    assert req.rdzv_ports_default() == defaults["torchrig_rdzv_ports"]


def refused_with(values: dict, **kwargs) -> str:
    with pytest.raises(req.RequestError) as e:
        req.request(values, HOSTS, "cluster", **kwargs)
    return str(e.value)


@pytest.mark.parametrize("env", [
    {"A": f"1\n{ENV['entrypoint']}=-c import os; os.system('id')"},
    {"A": "x\ry"}, {"A": "tab\there"}, {"A": "nul\x00"}, {"A": None}, {"A": ["x"]}, {"A": True},
])
def test_an_env_value_that_could_start_another_variable_is_refused(env):
    """Item 7: values were written raw into the job's env file, so a newline set any
    variable, the entry point included."""
    message = refused({"env": env})
    assert message.startswith("-e env is a mapping of NAME: value")
    assert "values strings or numbers on one line, without control characters; the value of A" in message


@pytest.mark.parametrize("name", [ENV["entrypoint"], ENV["args"], ENV["job"] + "_X", "1A", "A-B", "A B",
                                  "A\n", "A=B", ""])
def test_env_names_are_shell_names_and_not_the_contracts(name):
    """Item 7: env names were not checked; the job contract's (its prefix) are torchrig's."""
    assert f"the name {json.dumps(name)} is not one." in refused({"env": {name: "1"}})


def test_good_env_reaches_the_job_as_strings():
    assert settings({"env": {"NCCL_IB_DISABLE": 1, "MY_FLAG": "a b $HOME"}})["torchrun_env"] == {
        "NCCL_IB_DISABLE": "1", "MY_FLAG": "a b $HOME"}
    assert "mapping of NAME: value" in refused({"env": "A=1"})


@pytest.mark.parametrize("name", ["my script.py", "x;id.py", "$(id).py", "train.py\n"])
def test_a_script_files_own_name_is_checked(tmp_path: Path, name):
    """Item 7: a script file's name goes on the job's command line (the entry point)."""
    script = tmp_path / name
    script.write_text("print('hi')\n")
    message = refused({"script": str(script)})
    assert f"the file's name {json.dumps(name)} must be letters, digits" in message


def test_entry_names_are_full_matches(tmp_path: Path):
    """Item 7: re.match with $ accepted a trailing newline."""
    code = tmp_path / "ddp"
    code.mkdir()
    (code / "main.py\n").write_text("print('x')\n")
    assert 'entry="main.py\\n" must name a file' in refused({"script": str(code), "entry": "main.py\n"})


@pytest.mark.parametrize("train_options", [{"epochs": 0}, {"lr": "fast"}, {"no-such-option": 1},
                                           {"batch-size": [1, 2]}])
def test_train_options_are_checked_with_the_rest(train_options):
    """Item 7: train_options were merged after the checks, so {"epochs": 0} reached the job."""
    message = refused({"train_options": train_options})
    assert message.startswith("Bad training option.")
    assert f"(got {json.dumps(train_options)}). Found: " in message


def test_train_options_win_over_the_named_options():
    assert settings({"epochs": "3", "train_options": {"epochs": 5}})["torchrun_train_options"]["epochs"] == 5


@pytest.mark.parametrize(("typed", "hint"), [(["epoch"], " (did you mean epochs?)"),
                                             (["datset"], " (did you mean dataset?)"),
                                             (["nodes", "restarts"], " (did you mean max_restarts?)"),
                                             (["frobnicate"], "")])
def test_an_unknown_e_name_is_refused_naming_it_and_the_known_ones(typed, hint):
    """Item 7: `-e epoch=3` was ignored without a word; the job trained with the default."""
    message = refused_with({}, typed=typed)
    bad = [n for n in typed if n != "nodes"][0]
    assert message.startswith(f"-e {bad} is not a setting of train.yml{hint}. train.yml's settings: nodes, job,")
    assert "results_dir, fetch_checkpoints, group;" in message


def test_role_settings_and_ansibles_own_names_may_be_typed():
    typed = ["epochs", "torchrun_join_timeout", "torchrig_rdzv_ports", "ansible_user", "_raw_params"]
    req._check_names(typed)


def test_data_is_a_controller_path_made_absolute_or_a_name_of_torchrig_datasets(tmp_path: Path, monkeypatch):
    (tmp_path / "set").mkdir()
    (tmp_path / "one.csv").write_text("x\n")
    monkeypatch.chdir(tmp_path)
    assert settings({"data": "set"})["torchrun_data"] == str(tmp_path / "set")
    assert settings({"data": "one.csv"})["torchrun_data"] == str(tmp_path / "one.csv")
    named = settings({"data": "imgs"}, datasets={"imgs": str(tmp_path / "set")})
    assert named["torchrun_data"] == str(tmp_path / "set")
    assert "torchrun_data" not in settings({})


def test_data_that_is_neither_a_path_nor_a_name_lists_the_names(tmp_path: Path):
    message = refused_with({"data": "imgs"}, datasets={"cifar": "/x", "mnist": "/y"})
    assert message.endswith("No job was started.")
    assert "data=imgs is neither a directory or file on the controller nor a name of the inventory's " \
           "torchrig_datasets (its names: cifar, mnist)." in message
    assert "(its names: none)" in refused_with({"data": str(tmp_path / "nope")})


def test_a_named_dataset_whose_path_is_missing_names_both(tmp_path: Path):
    message = refused_with({"data": "imgs"}, datasets={"imgs": str(tmp_path / "gone")})
    assert f"data=imgs (torchrig_datasets: {tmp_path}/gone) does not exist on the controller." in message


def test_unreadable_data_is_refused(open_tmp: Path):
    # Checked as a user root's override of file modes does not cover (as_unprivileged).
    locked = open_tmp / "locked"
    locked.mkdir(mode=0o000)
    assert f"data={locked} is not readable by this user on the controller." in \
        as_unprivileged(lambda: refused_with({"data": str(locked)}))


def test_gpus_and_queue_are_handed_on_and_bad_ones_named():
    """Issue 32: -e gpus=N (GPUs per node, or all) and -e queue=true."""
    got = settings({"gpus": "1", "queue": "true"})
    assert (got["torchrun_gpus"], got["torchrun_queue"]) == (1, True)
    assert settings({"gpus": "ALL"})["torchrun_gpus"] == "all"
    assert refused({"gpus": "0"}).startswith("gpus must be the GPUs per node the job holds, a whole number from 1, "
                                             'or all (the default: every GPU of each node); got "0".')
    assert 'queue must be true' in refused({"queue": "later"})


@pytest.mark.parametrize(("script", "job"), [
    ("train.py", "train"),
    ("path/to/finetune_llm.py", "finetune_llm"),
    ("ddp/", "ddp"),
    ("my exp/", "my-exp"),
    ("run.sh", "run.sh"),
    ("_.py", "mnist5k-cnn"),
])
def test_a_script_job_without_job_is_named_after_its_script(tmp_path, script, job):
    """Not mnist5k-cnn, like the demo: two scripts must not share a job, nor a script the demo's."""
    path = tmp_path / script
    if script.endswith("/"):
        path.mkdir(parents=True)
        (path / "train.py").write_text("")
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    assert req.script_job_name(str(path) + ("/" if script.endswith("/") else ""), "mnist5k-cnn") == job
    if job != "mnist5k-cnn" and " " not in script:
        assert settings({"script": str(path)})["torchrun_job"] == job
    assert settings({"script": str(path), "job": "given"})["torchrun_job"] == "given"


def test_fetch_checkpoints_is_true_or_false():
    assert settings({"fetch_checkpoints": "true"})["torchrun_fetch_checkpoints"] is True
    assert settings({"fetch_checkpoints": "no"})["torchrun_fetch_checkpoints"] is False
    message = refused({"fetch_checkpoints": "maybe"})
    assert 'detach and fetch_checkpoints true or false (got "default", "maybe")' in message
