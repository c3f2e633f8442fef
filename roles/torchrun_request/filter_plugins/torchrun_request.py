"""train.yml's request, checked on the controller before any host is touched.

`request()` takes the -e values that were given and returns the job's settings, or raises
one RequestError whose message names the bad value and what is allowed. The checks run in
a fixed order and the first that fails is the one reported. Plain functions, unit-tested in
tests/test_torchrun_request.py; tests/test_train_validation.py runs them through train.yml.

train.yml's -e names are listed once, in NAMES below: the role reads the variables of
these names (`torchrun_request_pattern`), and the settings come back under the torchrun
role's own variable names, those that were given or that the request decides, so that
train.yml hands them on as one dict (torchrun_settings); the torchrun role's defaults
fill in the rest.

Rules that come from elsewhere, read by path so that there is one copy of each:

- the training options (dataset, model, epochs, batch_size, lr, seed, checkpoint_every and
  train_options): the training package's own `check_settings`, DATASETS and MODELS
  (training/src/torchrig/config.py, standard library and PyYAML only; not `import
  torchrig`, which the controller's Ansible may not have installed);
- the job's environment names, which `-e env` may not set: the package's job contract
  (training/src/torchrig/contract.py);
- a job's name: `torchrig_job_name_pattern`, and the rendezvous ports the firewall opens,
  `torchrig_rdzv_ports`, in roles/torchrig/defaults/main.yml (the inventory may set the
  latter; the role passes the inventory's value);
- a script directory's entry file: `_torchrun_entry_pattern` in roles/torchrun/vars/main.yml;
- the torchrun role's default entry file, for the check of a script directory
  (roles/torchrun/defaults/main.yml);
- extra_args: the torchrun role's `job_args` (roles/torchrun/filter_plugins/torchrun_job.py).
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
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
CONTRACT_PY = REPO / "training" / "src" / "torchrig" / "contract.py"
JOB_ARGS_PY = ROLES / "torchrun" / "filter_plugins" / "torchrun_job.py"
SHARED_DEFAULTS = ROLES / "torchrig" / "defaults" / "main.yml"
TORCHRUN_DEFAULTS = ROLES / "torchrun" / "defaults" / "main.yml"
TORCHRUN_VARS = ROLES / "torchrun" / "vars" / "main.yml"

NOT_STARTED = "No job was started."
WHOLE = re.compile(r"[0-9]+")
PORTS = re.compile(r"\s*([0-9]+)\s*-\s*([0-9]+)\s*")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")

# train.yml's -e names, the one list: name -> the torchrun role's variable it sets (None:
# used by the request itself).
NAMES: dict[str, str | None] = {
    "nodes": "torchrun_nnodes", "job": "torchrun_job",
    "dataset": "torchrun_train_options", "model": "torchrun_train_options",
    "epochs": "torchrun_train_options", "batch_size": "torchrun_train_options",
    "lr": "torchrun_train_options", "seed": "torchrun_train_options",
    "checkpoint_every": "torchrun_train_options", "train_options": "torchrun_train_options",
    "rdzv_port": "torchrun_rdzv_port", "max_restarts": "torchrun_max_restarts",
    "nproc_per_node": "torchrun_nproc_per_node", "detach": "torchrun_wait",
    "gpus": "torchrun_gpus", "queue": "torchrun_queue",
    "min_nodes": "torchrun_min_nodes", "script": "torchrun_script", "entry": "torchrun_script_entry",
    "extra_args": "torchrun_extra_args", "env": "torchrun_env", "data": "torchrun_data",
    "results_dir": "torchrun_fetch_dir", "fetch_checkpoints": "torchrun_fetch_checkpoints", "group": None,
}
# What Ansible keeps of an -e key=value that it split at a space.
SPLIT = "_raw_params"
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
def job_contract() -> ModuleType:
    """The training package's job contract, loaded from its file."""
    return _load(CONTRACT_PY, "torchrig_request_contract")


@functools.cache
def _job_args_module() -> ModuleType:
    return _load(JOB_ARGS_PY, "torchrig_request_job_args")


@functools.cache
def _yaml(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def job_name_pattern() -> str:
    """torchrig_job_name_pattern, as the torchrig role's defaults give it."""
    return _yaml(SHARED_DEFAULTS)["torchrig_job_name_pattern"]


def rdzv_ports_default() -> str:
    """torchrig_rdzv_ports, as the torchrig role's defaults give it."""
    return _yaml(SHARED_DEFAULTS)["torchrig_rdzv_ports"]


def entry_pattern() -> str:
    """What a script directory's entry file may be called: a relative path inside it, no
    '..', no spaces (the torchrun role's _torchrun_entry_pattern)."""
    return _yaml(TORCHRUN_VARS)["_torchrun_entry_pattern"]


def torchrun_default(name: str) -> Any:
    """A torchrun role default: the literal in `{{ torchrun_settings.NAME | default(LITERAL) }}`."""
    text = _yaml(TORCHRUN_DEFAULTS)[name]
    m = re.fullmatch(r"\{\{ torchrun_settings\.\w+ \| default\((.*)\) \}\}", str(text))
    return yaml.safe_load(m[1]) if m else text


def names_pattern(_: Any = None) -> str:
    """train.yml's -e names as one full-match pattern, for ansible.builtin.varnames."""
    return "^(" + "|".join([*NAMES, SPLIT]) + ")$"


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


def port_range(text: Any) -> tuple[int, int]:
    """'29400-29499' as (29400, 29499)."""
    m = PORTS.fullmatch(str(text))
    if not m or not 1 <= int(m[1]) <= int(m[2]) <= 65535:
        raise RequestError(f"torchrig_rdzv_ports must be first-last, two ports, e.g. 29400-29499; got "
                           f"{_json(text)}. " + NOT_STARTED)
    return int(m[1]), int(m[2])


# ------------------------------------------------------------------ the checks


def _check_whole_values(values: Mapping[str, Any]) -> None:
    """Ansible's -e key=value ends a value at a space and keeps the rest as _raw_params."""
    if SPLIT in values:
        raise RequestError(
            f"Ansible split an -e value at a space and dropped {_json(values[SPLIT])} "
            "(in -e key=value, a value ends at the first space). Quote the value inside the argument, "
            """e.g. -e 'extra_args="10 2 --batch_size 32"', or give YAML/JSON, e.g. """
            """-e '{"extra_args": ["10", "2", "--batch_size", "32"]}'. """ + NOT_STARTED)


def _role_prefixes() -> tuple[str, ...]:
    return tuple(f"{d.name}_" for d in ROLES.iterdir() if (d / "meta").is_dir())


def _check_names(typed: Iterable[str]) -> None:
    """Every name typed with -e is one of train.yml's, a role's setting (its full name, which
    the role's argument spec checks) or Ansible's own (ansible_*)."""
    for name in sorted(str(n) for n in typed):
        if name in NAMES or name == SPLIT or name.startswith(("ansible_", *_role_prefixes())):
            continue
        close = difflib.get_close_matches(name, list(NAMES), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise RequestError(
            f"-e {name} is not a setting of train.yml{hint}. train.yml's settings: {', '.join(NAMES)}; "
            "a role's setting goes by its full name (e.g. -e torchrun_join_timeout=600). " + NOT_STARTED)


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


def script_job_name(script: Any, default: str) -> str:
    """The job name of a script job without job=: its script's name without .py
    (a directory's own name), in the characters a job name may have; `default` (the
    package job's dataset-model) for no script, or a script name with nothing usable."""
    name = os.path.basename(str(script or "").rstrip("/"))
    name = re.sub(r"\.py$", "", name)
    # Each character the job name pattern takes after a first letter stays; others become '-'.
    name = re.sub("-+", "-", "".join(c if job_name_ok("a" + c) else "-" for c in name))
    while name and not job_name_ok(name):
        name = name[1:] if not job_name_ok(name[:1]) else name[:-1]
    return name or default


def _check_job_name(job: str) -> None:
    if not job_name_ok(job):
        raise RequestError(
            "job must be 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit "
            f"(it names a systemd unit and a directory); got {_json(job)}. " + NOT_STARTED)


def _package_options(values: Mapping[str, Any], dataset: Any, model: Any) -> dict[str, Any]:
    """The package's options as given, train_options last (they win), before any check."""
    train_options = values.get("train_options") or {}
    if not isinstance(train_options, Mapping):
        raise RequestError(f"train_options must be a mapping of option: value, got {_json(train_options)}. "
                           + NOT_STARTED)
    options: dict[str, Any] = {"dataset": dataset, "model": model}
    options.update((flag, values[name]) for name, (flag, _) in TRAINING_OPTIONS.items() if name in values)
    options.update(train_options)
    return options


def _check_options(values: Mapping[str, Any], options: Mapping[str, Any], ports: tuple[int, int]) -> None:
    """The package's options (its own check_settings, train_options included) and the
    launch's numbers."""
    config = training_config()
    problems = config.check_settings(options)
    port = values.get("rdzv_port", ports[0])  # not given: picked from the job's name, in range
    bad = (problems
           or not (_whole(port) and ports[0] <= int(str(port)) <= ports[1])
           or not all(_whole(values.get(name, 0)) for name in ("max_restarts", "nproc_per_node"))
           or any(str(values.get(name, False)).lower() not in ("true", "false", "yes", "no")
                  for name in ("detach", "fetch_checkpoints")))
    if bad:
        given = {name: _json(values.get(name, "default")) for name in (
            "epochs", "batch_size", "lr", "seed", "checkpoint_every", "rdzv_port", "max_restarts",
            "nproc_per_node")}
        found = f" Found: {'; '.join(problems)}." if problems else ""
        raise RequestError(
            f"Bad training option. Allowed: dataset one of {', '.join(config.DATASETS)} "
            f"(got {_json(options.get('dataset'))}); model {_either(config.MODELS)} "
            f"(got {_json(options.get('model'))}); "
            f"epochs and batch_size whole numbers >= 1 (got {given['epochs']}, {given['batch_size']}); "
            f"lr a positive number (got {given['lr']}); "
            f"seed and checkpoint_every whole numbers >= 0 (got {given['seed']}, {given['checkpoint_every']}); "
            f"rdzv_port a port of torchrig_rdzv_ports, {ports[0]}-{ports[1]}, which the firewall opens to "
            f"peers (got {given['rdzv_port']}); "
            f"max_restarts and nproc_per_node whole numbers >= 0 (got {given['max_restarts']}, "
            f"{given['nproc_per_node']}); detach and fetch_checkpoints true or false (got "
            f"{_json(values.get('detach', 'default'))}, "
            f"{_json(values.get('fetch_checkpoints', 'default'))}); train_options the package's options "
            f"(got {_json(values.get('train_options', {}))}).{found} " + NOT_STARTED)


def _check_gpus(values: Mapping[str, Any]) -> None:
    """gpus: GPUs per node, a whole number from 1 or all; queue: true or false. Whether the
    nodes have that many free is the torchrun role's check, on the nodes."""
    gpus, queue = values.get("gpus", "all"), values.get("queue", False)
    if not (str(gpus).lower() == "all" or (_whole(gpus) and int(str(gpus)) >= 1)):
        raise RequestError(f"gpus must be the GPUs per node the job holds, a whole number from 1, or all (the "
                           f"default: every GPU of each node); got {_json(gpus)}. " + NOT_STARTED)
    if str(queue).lower() not in ("true", "false", "yes", "no"):
        raise RequestError(f"queue must be true (wait for the GPUs to free, then start by itself) or false "
                           f"(refuse when they are held); got {_json(queue)}. " + NOT_STARTED)


def _check_min_nodes(values: Mapping[str, Any], nnodes: int) -> None:
    if "min_nodes" not in values:
        return
    min_nodes = values["min_nodes"]
    if not (_whole(min_nodes) and 1 <= int(str(min_nodes)) <= nnodes):
        raise RequestError(
            f"min_nodes must be a whole number from 1 to the job's {nnodes} nodes (the job goes on "
            f"while at least that many take part); got {_json(min_nodes)}. " + NOT_STARTED)


def _check_script(values: Mapping[str, Any], script: str, entry: str) -> None:
    """The user's script on the controller and, for a directory, its entry file. A file's
    own name and the entry file go on the job's command line: full matches only."""
    if script and not os.path.exists(script):
        raise RequestError(f"script={script} does not exist on the controller. " + NOT_STARTED)
    is_dir = bool(script) and os.path.isdir(script)
    name = os.path.basename(script.rstrip("/"))
    if script and not is_dir and not re.fullmatch(entry_pattern(), name):
        raise RequestError(
            f"script={script}: the file's name {_json(name)} must be letters, digits, '_', '.', '+', '-' "
            "(it goes on the job's command line). Rename it, or give its directory: script=DIR "
            "entry=FILE. " + NOT_STARTED)
    if "entry" not in values and not is_dir:
        return
    if not (is_dir and re.fullmatch(entry_pattern(), entry) and os.path.isfile(f"{script}/{entry}")):
        where = ("none was given: script=DIR" if not script
                 else f"script={script}" + (", a file, is not one" if os.path.isfile(script) else ""))
        raise RequestError(
            f"entry={_json(entry)} must name a file inside the script directory ({where}), as a "
            "relative path of letters, digits, '_', '.', '+', '-' without '..'; the default is "
            f"{torchrun_default('torchrun_script_entry')}. " + NOT_STARTED)


def _extra_args(values: Mapping[str, Any]) -> list[str]:
    try:
        return _job_args_module().job_args(values.get("extra_args", torchrun_default("torchrun_extra_args")))
    except ValueError as e:
        raise RequestError(
            f"{e}. extra_args is a YAML/JSON list, -e '{{\"extra_args\": [\"7\", \"two words\"]}}', "
            """or one string split as a shell would, -e 'extra_args="7 \\"two words\\""'. """
            + NOT_STARTED) from None


def _env(values: Mapping[str, Any]) -> dict[str, str]:
    """-e env: variables for the job's environment file, one line each. A name is a full
    match of a shell name and not one of the job contract's (which torchrig sets); a value
    is one line without control characters (a newline would start another variable)."""
    env = values.get("env", torchrun_default("torchrun_env"))
    prefix = job_contract().ENV_PREFIX
    how = ("-e env is a mapping of NAME: value, -e '{\"env\": {\"NCCL_IB_DISABLE\": \"1\"}}': names of "
           f"letters, digits and '_', not starting with a digit nor with {prefix} (torchrig's own); values "
           "strings or numbers on one line, without control characters")
    if not isinstance(env, Mapping):
        raise RequestError(f"{how}; got {_json(env)}. " + NOT_STARTED)
    out = {}
    for name, value in env.items():
        if not ENV_NAME.fullmatch(str(name)) or str(name).startswith(prefix):
            raise RequestError(f"{how}; the name {_json(name)} is not one. " + NOT_STARTED)
        if isinstance(value, bool) or not isinstance(value, (str, int, float)) or CONTROL.search(str(value)):
            raise RequestError(f"{how}; the value of {name}, {_json(value)}, is not one. " + NOT_STARTED)
        out[str(name)] = str(value)
    return out


def _data(values: Mapping[str, Any], datasets: Any) -> str:
    """-e data: a directory or file on the controller, or a name of the inventory's
    torchrig_datasets (name: controller path); its absolute path, or '' for none."""
    data = values.get("data")
    if data in (None, ""):
        return ""
    datasets = datasets or {}
    if not isinstance(datasets, Mapping):
        raise RequestError(f"torchrig_datasets must be a mapping of name: path on the controller; got "
                           f"{_json(datasets)}. " + NOT_STARTED)
    text = str(data)
    named = "/" not in text and text in datasets
    path = os.path.expanduser(str(datasets[text]) if named else text)
    where = f"data={text} (torchrig_datasets: {path})" if named else f"data={text}"
    if not named and not os.path.exists(path):
        names = ", ".join(sorted(map(str, datasets))) or "none"
        raise RequestError(
            f"{where} is neither a directory or file on the controller nor a name of the inventory's "
            f"torchrig_datasets (its names: {names}). " + NOT_STARTED)
    if not os.path.exists(path):
        raise RequestError(f"{where} does not exist on the controller. " + NOT_STARTED)
    if not (os.path.isdir(path) or os.path.isfile(path)):
        raise RequestError(f"{where} is neither a directory nor a regular file. " + NOT_STARTED)
    if not os.access(path, os.R_OK | (os.X_OK if os.path.isdir(path) else 0)):
        raise RequestError(f"{where} is not readable by this user on the controller. " + NOT_STARTED)
    return os.path.abspath(path)


# ---------------------------------------------------------------- the request


def request(values: Mapping[str, Any], hosts: Sequence[str], group: str = "cluster",
            typed: Iterable[str] = (), rdzv_ports: Any = None, datasets: Any = None) -> dict[str, Any]:
    """The job's settings from train.yml's -e `values` (only those given), the inventory
    `hosts` of `group`; RequestError for the first check that fails.

    `typed`: the names typed with -e (none when train.yml was imported with vars);
    `rdzv_ports`: the inventory's torchrig_rdzv_ports (None: the torchrig role's default);
    `datasets`: the inventory's torchrig_datasets (name: controller path), for -e data=NAME.

    Returned: nodes (the selected hosts) and vars, the torchrun role's variables that were
    given or that the request decides (the job, its nodes, the options), under their own
    names; the torchrun role's defaults give the others.
    """
    hosts = [str(h) for h in hosts]
    _check_whole_values(values)
    _check_names(typed)
    nodes = select_nodes(values.get("nodes", len(hosts)), hosts, group)
    # Not given: the package's own defaults (its Config).
    fields = training_config().FIELDS
    dataset = values.get("dataset", fields["dataset"].default)
    model = values.get("model", fields["model"].default)
    job = str(values["job"]) if "job" in values else script_job_name(values.get("script"), f"{dataset}-{model}")
    _check_job_name(job)
    options = _package_options(values, dataset, model)
    ports = port_range(rdzv_ports if rdzv_ports not in (None, "") else rdzv_ports_default())
    _check_options(values, options, ports)
    _check_min_nodes(values, len(nodes))
    _check_gpus(values)
    script = str(values.get("script") or "")
    entry = str(values.get("entry", torchrun_default("torchrun_script_entry")))
    _check_script(values, script, entry)
    extra_args = _extra_args(values)
    env = _env(values)
    data = _data(values, datasets)

    for name, (flag, kind) in TRAINING_OPTIONS.items():
        if flag in options and name in values and flag not in (values.get("train_options") or {}):
            options[flag] = kind(str(values[name]))

    decided: dict[str, Any] = {
        "torchrun_job": job,
        "torchrun_nnodes": len(nodes),
        "torchrun_rdzv_node": nodes[0],
        "torchrun_train_options": options,
    }
    given = {
        "min_nodes": lambda v: int(str(v)), "rdzv_port": lambda v: int(str(v)),
        "nproc_per_node": lambda v: int(str(v)), "max_restarts": lambda v: int(str(v)),
        "script": lambda v: script, "entry": lambda v: entry, "extra_args": lambda v: extra_args,
        "env": lambda v: env, "detach": lambda v: str(v).lower() not in ("true", "yes"),
        "results_dir": lambda v: f"{v}/{job}", "data": lambda v: data,
        "gpus": lambda v: str(v).lower() if str(v).lower() == "all" else int(str(v)),
        "queue": lambda v: str(v).lower() in ("true", "yes"),
        "fetch_checkpoints": lambda v: str(v).lower() in ("true", "yes"),
    }
    decided.update((NAMES[name], value(values[name])) for name, value in given.items()  # type: ignore[misc]
                   if name in values and values[name] not in (None, ""))
    return {"nodes": nodes, "vars": decided}


def request_problem(values: Mapping[str, Any], hosts: Sequence[str], group: str = "cluster",
                    typed: Iterable[str] = (), rdzv_ports: Any = None, datasets: Any = None) -> str:
    """The message of the first check that fails, or "" for a good request. The role
    prints it with an assert: a filter that raises gets Ansible's own wrapper around it."""
    try:
        request(values, hosts, group, typed, rdzv_ports, datasets)
    except RequestError as e:
        return str(e)
    return ""


class FilterModule:
    def filters(self):
        return {
            "torchrun_request": request,
            "torchrun_request_problem": request_problem,
            "torchrun_request_pattern": names_pattern,
            "torchrun_request_job_problem": job_name_problem,
        }
