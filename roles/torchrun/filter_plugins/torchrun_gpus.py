"""The GPU choice on the controller: module_utils/torchrun_gpus.py, loaded by path (the one
copy, which the torchrun_jobs module and the nodes' queue runner use too). Unit-tested in
tests/test_torchrun_gpus.py.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

GPUS_PY = Path(__file__).resolve().parents[1] / "module_utils" / "torchrun_gpus.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("torchrun_gpus_logic", GPUS_PY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GPUS = _load()


class FilterModule:
    def filters(self):
        return {
            # jobs | torchrun_gpu_choice(total, want, job, host) -> {gpus, problem}
            "torchrun_gpu_choice": lambda jobs, total, want, job, host: GPUS.choice(total, jobs, want, job, host),
            # gpus | torchrun_gpus_env(nproc, names) -> the job's .gpus file
            "torchrun_gpus_env": GPUS.gpus_env,
            # ActiveState | torchrun_unit_running -> whether systemd counts the unit's processes as running
            "torchrun_unit_running": lambda state: state in GPUS.RUNNING_STATES,
        }
