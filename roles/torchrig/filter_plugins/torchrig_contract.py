"""The job contract for the roles: the training package's torchrig/contract.py, the one
place that names the job's environment, its run directory's files and the exit status
and signal that end a job for good.

Loaded by file path (standard library only), as torchrun_request loads the package's
config.py: the controller's Ansible may not have the package installed. Unit-tested in
tests/test_contract.py.

    {{ 'files.fatal' | torchrig_contract }}      the name of the file a fatal failure leaves
    {{ 'env' | torchrig_contract }}              {'job': <the job's name variable>, ...}
    {{ 'nnodes' | torchrig_env_ref }}            ${<nnodes variable>}, systemd's form inside a word
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

CONTRACT_PY = Path(__file__).resolve().parents[3] / "training" / "src" / "torchrig" / "contract.py"


class ContractError(ValueError):
    """A name the contract does not have. Not Ansible's own error class: importing Ansible
    in the test process patches sys.intern, which torch's compiler then refuses."""


@functools.cache
def contract_module() -> ModuleType:
    """The training package's contract module, loaded from its file."""
    spec = importlib.util.spec_from_file_location("torchrig_role_contract", CONTRACT_PY)
    if spec is None or spec.loader is None:
        raise ContractError(f"cannot load {CONTRACT_PY}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def contract(path: str = "") -> Any:
    """The part of the contract at a dotted `path` ('' for all of it)."""
    value: Any = contract_module().contract()
    for key in [k for k in str(path).split(".") if k]:
        if not isinstance(value, dict) or key not in value:
            raise ContractError(f"the job contract has no {path!r} (training/src/torchrig/contract.py)")
        value = value[key]
    return value


def env_ref(key: str) -> str:
    """The job environment's variable `key` as systemd expands it inside a word."""
    return "${" + contract(f"env.{key}") + "}"


class FilterModule:
    def filters(self):
        return {"torchrig_contract": contract, "torchrig_env_ref": env_ref}
