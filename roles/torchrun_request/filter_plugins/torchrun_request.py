"""train.yml's request, checked on the controller before any host is touched.

`request()` takes the -e values that were given and returns the job's settings, or raises
one RequestError whose message names the bad value and what is allowed. The checks run in
a fixed order and the first that fails is the one reported. Plain functions, unit-tested in
tests/test_torchrun_request.py; tests/test_train_validation.py runs them through train.yml.

Four rules come from elsewhere, read by path so that there is one copy of each:

- the training options (dataset, model, epochs, batch_size, lr, seed, checkpoint_every):
  the training package's own `check_settings`, DATASETS and MODELS
  (training/src/torchrig/config.py, standard library and PyYAML only; not `import
  torchrig`, which the controller's Ansible may not have installed);
- a job's name: `torchrig_job_name_pattern` in roles/torchrig/defaults/main.yml;
- a script directory's entry file: `_torchrun_entry_pattern` in roles/torchrun/vars/main.yml;
- extra_args: the torchrun role's `job_args` (roles/torchrun/filter_plugins/torchrun_job.py).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml


class RequestError(ValueError):
    """A request that cannot start a job. Not Ansible's own error class: importing Ansible
    in the test process patches sys.intern, which torch's compiler then refuses."""


ROLES = Path(__file__).resolve().parents[2]
REPO = ROLES.parent
CONFIG_PY = REPO / "training" / "src" / "torchrig" / "config.py"
JOB_ARGS_PY = ROLES / "torchrun" / "filter_plugins" / "torchrun_job.py"
TORCHRIG_DEFAULTS = ROLES / "torchrig" / "defaults" / "main.yml"
TORCHRUN_VARS = ROLES / "torchrun" / "vars" / "main.yml"

NOT_STARTED = "No job was started."
WHOLE = re.compile(r"[0-9]+")
# train.yml's names of the package's options and their flag names in the job's config.
TRAINING_OPTIONS = {"epochs": ("epochs", int), "batch_size": ("batch-size", int),
                    "lr": ("lr", float), "seed": ("seed", int),
                    "checkpoint_every": ("checkpoint-every", int)}


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise RequestError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def training_config() -> ModuleType:
    """The training package's config module, loaded from its file."""
    return _load(CONFIG_PY, "torchrig_request_config")


@functools.cache
def _job_args_module() -> ModuleType:
    return _load(JOB_ARGS_PY, "torchrig_request_job_args")


@functools.cache
def job_name_pattern() -> str:
    """torchrig_job_name_pattern, as the torchrig role's defaults give it."""
    return yaml.safe_load(TORCHRIG_DEFAULTS.read_text())["torchrig_job_name_pattern"]


@functools.cache
def entry_pattern() -> str:
    """What a script directory's entry file may be called: a relative path inside it, no
    '..', no spaces (the torchrun role's _torchrun_entry_pattern)."""
    return yaml.safe_load(TORCHRUN_VARS.read_text())["_torchrun_entry_pattern"]


def _json(value: Any) -> str:
    """A value as Ansible's to_json shows it: strings in double quotes."""
    return json.dumps(value)


def _either(words: Sequence[str]) -> str:
    """'a or b', 'a, b or c'."""
    return " or ".join(words) if len(words) < 3 else f"{', '.join(words[:-1])} or {words[-1]}"


def _whole(value: Any) -> bool:
    return WHOLE.fullmatch(str(value)) is not None


def job_name_ok(job: Any) -> bool:
    return re.fullmatch(job_name_pattern(), str(job)) is not None


def job_name_problem(job: Any = None) -> str:
    """'' for a usable job name, else what status.yml, logs.yml and stop.yml say
    (None: no job was given)."""
    if job is not None and job_name_ok(job):
        return ""
    return ("Pass the job's name: -e job=NAME (letters, digits, '.', '_', '-'); got "
            f"{_json('nothing' if job is None else job)}.")


# ------------------------------------------------------------------ the checks


def _check_whole_values(values: Mapping[str, Any]) -> None:
    """Ansible's -e key=value ends a value at a space and keeps the rest as _raw_params."""
    if "_raw_params" in values:
        raise RequestError(
            f"Ansible split an -e value at a space and dropped {_json(values['_raw_params'])} "
            "(in -e key=value, a value ends at the first space). Quote the value inside the argument, "
            """e.g. -e 'extra_args="10 2 --batch_size 32"', or give YAML/JSON, e.g. """
            """-e '{"extra_args": ["10", "2", "--batch_size", "32"]}'. """ + NOT_STARTED)


def select_nodes(nodes: Any, hosts: Sequence[str], group: str) -> list[str]:
    """The job's nodes: the first N hosts of the group, or the hosts named, each once."""
    text = str(nodes)
    number = _whole(text)
    selected = list(hosts[:int(text)]) if number else [n.strip() for n in text.split(",")]
    if not hosts or not (
            (number and int(text) >= 1)
            or (not number and not set(selected) - set(hosts) and len(set(selected)) == len(selected))):
        raise RequestError(
            f"nodes must be a number from 1 to {len(hosts)} (the hosts of group {group}: "
            f"{', '.join(hosts) or 'none; start some with make up'}) or a comma-separated list of "
            f"them, each once; got '{text}'. " + NOT_STARTED)
    if number and int(text) > len(hosts):
        raise RequestError(
            f"nodes={text} but group {group} has {len(hosts)} provisioned hosts ({', '.join(hosts)}). "
            "Add hosts to the inventory and run provision.yml, or ask for fewer. " + NOT_STARTED)
    return selected


def _check_job_name(job: str) -> None:
    if not job_name_ok(job):
        raise RequestError(
            "job must be 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit "
            f"(it names a systemd unit and a directory); got {_json(job)}. " + NOT_STARTED)


def _check_options(values: Mapping[str, Any], dataset: Any, model: Any) -> None:
    """The package's options (its own check_settings) and the launch's numbers."""
    config = training_config()
    package = {"dataset": dataset, "model": model}
    package.update((name, values[name]) for name in TRAINING_OPTIONS if name in values)
    port = values.get("rdzv_port", 1)  # not given: picked from the job's name, nothing to check
    bad = (config.check_settings(package)
           or not (_whole(port) and 1 <= int(str(port)) <= 65535)
           or not all(_whole(values.get(name, 0)) for name in ("max_restarts", "nproc_per_node"))
           or str(values.get("detach", False)).lower() not in ("true", "false", "yes", "no"))
    if bad:
        given = {name: _json(values.get(name, "default")) for name in (
            "epochs", "batch_size", "lr", "seed", "checkpoint_every", "rdzv_port", "max_restarts",
            "nproc_per_node")}
        raise RequestError(
            f"Bad training option. Allowed: dataset one of {', '.join(config.DATASETS)} "
            f"(got {_json(dataset)}); model {_either(config.MODELS)} (got {_json(model)}); "
            f"epochs and batch_size whole numbers >= 1 (got {given['epochs']}, {given['batch_size']}); "
            f"lr a positive number (got {given['lr']}); "
            f"seed and checkpoint_every whole numbers >= 0 (got {given['seed']}, {given['checkpoint_every']}); "
            f"rdzv_port a port number (got {given['rdzv_port']}); "
            f"max_restarts and nproc_per_node whole numbers >= 0 (got {given['max_restarts']}, "
            f"{given['nproc_per_node']}); detach true or false. " + NOT_STARTED)


def _check_min_nodes(values: Mapping[str, Any], nnodes: int) -> None:
    if "min_nodes" not in values:
        return
    min_nodes = values["min_nodes"]
    if not (_whole(min_nodes) and 1 <= int(str(min_nodes)) <= nnodes):
        raise RequestError(
            f"min_nodes must be a whole number from 1 to the job's {nnodes} nodes (the job goes on "
            f"while at least that many take part); got {_json(min_nodes)}. " + NOT_STARTED)


def _check_script(values: Mapping[str, Any], script: str, entry: str) -> None:
    """The user's script on the controller and, for a directory, its entry file."""
    if script and not os.path.exists(script):
        raise RequestError(f"script={script} does not exist on the controller. " + NOT_STARTED)
    is_dir = bool(script) and os.path.isdir(script)
    if "entry" not in values and not is_dir:
        return
    if not (is_dir and re.match(entry_pattern(), entry) and os.path.isfile(f"{script}/{entry}")):
        where = ("none was given: script=DIR" if not script
                 else f"script={script}" + (", a file, is not one" if os.path.isfile(script) else ""))
        raise RequestError(
            f"entry={_json(entry)} must name a file inside the script directory ({where}), as a "
            "relative path of letters, digits, '_', '.', '+', '-' without '..'; the default is "
            "train.py. " + NOT_STARTED)


def _extra_args(values: Mapping[str, Any]) -> list[str]:
    try:
        return _job_args_module().job_args(values.get("extra_args", []))
    except ValueError as e:
        raise RequestError(
            f"{e}. extra_args is a YAML/JSON list, -e '{{\"extra_args\": [\"7\", \"two words\"]}}', "
            """or one string split as a shell would, -e 'extra_args="7 \\"two words\\""'. """
            + NOT_STARTED) from None


# ---------------------------------------------------------------- the request


def request(values: Mapping[str, Any], hosts: Sequence[str], group: str = "cluster") -> dict[str, Any]:
    """The job's settings from train.yml's -e `values` (only those given), the inventory
    `hosts` of `group`; RequestError for the first check that fails.

    Returned: job, nodes (the selected hosts), options (the job's config for the training
    package, flag names), min_nodes, rdzv_port, nproc_per_node, max_restarts, script, entry,
    extra_args (a list) and wait (not detach).
    """
    hosts = [str(h) for h in hosts]
    _check_whole_values(values)
    nodes = select_nodes(values.get("nodes", len(hosts)), hosts, group)
    dataset = values.get("dataset", "mnist5k")
    model = values.get("model", "cnn")
    job = str(values.get("job", f"{dataset}-{model}"))
    _check_job_name(job)
    _check_options(values, dataset, model)
    _check_min_nodes(values, len(nodes))
    script = str(values.get("script") or "")
    entry = str(values.get("entry", "train.py"))
    _check_script(values, script, entry)
    extra_args = _extra_args(values)

    train_options = values.get("train_options") or {}
    if not isinstance(train_options, Mapping):
        raise RequestError(f"train_options must be a mapping of option: value, got {_json(train_options)}. "
                           + NOT_STARTED)
    options = {"dataset": dataset, "model": model}
    for name, (flag, kind) in TRAINING_OPTIONS.items():
        if name in values:
            options[flag] = kind(str(values[name]))
    options.update(train_options)
    return {
        "job": job,
        "nodes": nodes,
        "options": options,
        "min_nodes": int(str(values.get("min_nodes", 0))),
        "rdzv_port": int(str(values.get("rdzv_port", 0))),
        "nproc_per_node": int(str(values.get("nproc_per_node", 0))),
        "max_restarts": int(str(values.get("max_restarts", 3))),
        "script": script,
        "entry": entry,
        "extra_args": extra_args,
        "wait": str(values.get("detach", False)).lower() not in ("true", "yes"),
    }


def request_problem(values: Mapping[str, Any], hosts: Sequence[str], group: str = "cluster") -> str:
    """The message of the first check that fails, or "" for a good request. The role
    prints it with an assert: a filter that raises gets Ansible's own wrapper around it."""
    try:
        request(values, hosts, group)
    except RequestError as e:
        return str(e)
    return ""


class FilterModule:
    def filters(self):
        return {
            "torchrun_request": request,
            "torchrun_request_problem": request_problem,
            "torchrun_request_job_problem": job_name_problem,
        }
