"""The GPU choice on the controller: the collection's module_utils/torchrun_gpus.py (the one
copy, which the torchrun_jobs module and the nodes' queue runner use too). Unit-tested in
tests/test_torchrun_gpus.py.
"""

from __future__ import annotations

from ansible_collections.torchrig.cluster.plugins.module_utils import torchrun_gpus as GPUS


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
