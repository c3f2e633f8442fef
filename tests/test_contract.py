"""The job contract (issue 33): the environment names, the run directory's files and the
exit status and signal that end a job are written once, in training/src/torchrig/contract.py.
The roles read it through one filter (roles/torchrig/filter_plugins/torchrig_contract.py);
the package imports it."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import jinja2
import pytest
from rolepy import ROOT, load

filt = load("roles/torchrig/filter_plugins/torchrig_contract.py", "torchrig_contract")
CONTRACT = filt.contract()
CONTRACT_PY = ROOT / "training/src/torchrig/contract.py"

# Where code lives that speaks the contract: the roles, the playbooks, the package and the
# tests. Markdown explains the names to people and is not code.
CODE = ("*.yml", "playbooks/**/*", "roles/**/*", "training/src/**/*", "training/tests/**/*", "tests/*.py")
SUFFIXES = {".py", ".yml", ".yaml", ".j2", ".sh", ".cfg", ".toml"}


def code_files() -> list[Path]:
    return sorted({p for pattern in CODE for p in ROOT.glob(pattern)
                   if p.is_file() and p.suffix in SUFFIXES and "__pycache__" not in p.parts})


def literals() -> list[str]:
    return [*CONTRACT["env"].values(), *CONTRACT["files"].values(), CONTRACT["fatal_signal"]]


def test_the_filter_gives_the_packages_contract():
    from torchrig import contract  # the package's own import

    assert contract.contract() == CONTRACT
    assert filt.contract("files.fatal") == contract.FILES["fatal"]
    assert filt.env_ref("args") == "${" + contract.ENV["args"] + "}"
    assert contract.fatal_signal() == signal.Signals[contract.FATAL_SIGNAL]
    with pytest.raises(filt.ContractError, match="the job contract has no 'files.nope'"):
        filt.contract("files.nope")


def test_every_name_of_the_contract_is_written_once():
    """grep for each name the contract defines (every environment variable, every run
    directory file, the signal) over the code finds the contract module only."""
    files = code_files()
    assert CONTRACT_PY in files and len(files) > 100
    for name in literals():
        found = [str(p.relative_to(ROOT)) for p in files
                 if p != Path(__file__) and re.search(rf"\b{re.escape(name)}\b", p.read_text(errors="replace"))]
        assert found == ["training/src/torchrig/contract.py"], (name, found)


def test_the_units_ending_statuses_are_written_once():
    """The exit status (3) and the signal the unit does not restart come from the contract."""
    unit = (ROOT / "roles/torchrun/templates/torchrig-job@.service.j2").read_text()
    assert re.search(r"RestartPreventExitStatus=\d", unit) is None
    assert re.search(r"\*/\d+\|", unit) is None


def render(template: str, **values: object) -> str:
    env = jinja2.Environment(undefined=jinja2.Undefined, keep_trailing_newline=True)
    # Ansible's filters the templates use, as far as these values need them.
    env.filters.update(filt.FilterModule().filters(), comment=lambda text: f"# {text}",
                       zip=lambda a, b: list(zip(a, b, strict=True)),
                       extract=lambda item, container, key: container[item][key],
                       torchrun_env_value=lambda v: f'"{v}"')
    return env.from_string((ROOT / "roles/torchrun/templates" / template).read_text()).render(**values)


def test_the_unit_and_the_env_file_carry_the_contracts_names():
    """The rendered unit reads the variables the env file writes, by the contract's names, and
    does not restart after the contract's exit status and signal."""
    names = CONTRACT["env"]
    values = {"_torchrun_contract": CONTRACT, "_torchrun_env_names": names, "torchrun_env": {},
              "torchrun_config_dir": "/etc/torchrig/jobs", "torchrun_run_root": "/var/lib/torchrig/runs",
              "torchrun_min_nodes": 0, "torchrun_nnodes": 2, "torchrun_last_call_timeout": 7}
    unit = render("torchrig-job@.service.j2", **values)
    env_file = render("job.env.j2", **values, torchrun_job="j", _torchrun_backend="gloo",
                      ansible_play_hosts_all=["n1"], hostvars={"n1": {"_torchrun_address": "10.0.0.1"}})
    written = set(re.findall(r"^([A-Z_]+)=", env_file, re.M))
    read = set(re.findall(r"\$\{([A-Z_]+)\}", unit)) | set(re.findall(r" \$([A-Z_]+)$", unit, re.M))
    assert read and read <= written, read - written
    assert {names[k] for k in ("nnodes", "rdzv_endpoint", "entrypoint", "args", "run_dir")} <= written
    assert f"--nnodes=${{{names['nnodes']}}} " in unit
    # An elastic job's wait for more nodes is the job's own setting, not torch's 30 s.
    assert f"{names['last_call_timeout']}=7\n" in env_file
    assert f",last_call_timeout=${{{names['last_call_timeout']}}}," in unit
    assert f"--module torchrig.worker ${names['entrypoint']}\n" in unit
    assert f"RestartPreventExitStatus={CONTRACT['exit_nodes_missing']} {CONTRACT['fatal_signal']}\n" in unit
    assert (f"success/*|*/{CONTRACT['exit_nodes_missing']}|*/{CONTRACT['fatal_signal_short']}) "
            "systemctl disable") in unit
