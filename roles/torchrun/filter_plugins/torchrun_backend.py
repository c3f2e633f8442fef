"""A job's one backend, decided across its hosts before any of them is changed.

Each rank would otherwise pick its own from torch.cuda.is_available(): GPU ranks ask for
nccl, CPU ranks for gloo, and the job hangs at its first collective. Plain functions,
unit-tested in tests/test_torchrun_backend.py.
"""

from __future__ import annotations


class BackendError(ValueError):
    """A job that cannot have one backend. Not Ansible's own error class: importing Ansible
    in the test process patches sys.intern, which torch's compiler then refuses."""


def job_backend(gpus_by_host: dict[str, int], job: str, cpu_group: str) -> str:
    """nccl when every host of the job has GPUs, gloo when none has; a mix is refused."""
    with_gpus = sorted(host for host, gpus in gpus_by_host.items() if int(gpus) > 0)
    without = sorted(host for host, gpus in gpus_by_host.items() if int(gpus) <= 0)
    if with_gpus and without:
        raise BackendError(
            f"Job {job} would run on GPU hosts ({', '.join(with_gpus)}) and CPU hosts "
            f"({', '.join(without)}), and a job has one backend (nccl or gloo). Choose nodes of "
            f"one kind with -e nodes=..., or add the GPU hosts to the {cpu_group} group to train "
            "on their CPUs. No job was started.")
    return "nccl" if with_gpus else "gloo"


class FilterModule:
    def filters(self):
        return {"torchrun_job_backend": job_backend}
