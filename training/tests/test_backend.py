"""The job's one backend (the contract's env backend, decided by train.yml across the job's hosts)
against what the host has: no GPU needed."""

from __future__ import annotations

import pytest

from torchrig.contract import ENV
from torchrig.dist import use_cuda


def test_a_gloo_job_keeps_a_host_with_gpus_on_its_cpu():
    assert use_cuda("gloo", cuda_available=True) is False


def test_an_nccl_job_trains_on_the_gpu():
    assert use_cuda("nccl", cuda_available=True) is True


def test_an_nccl_job_on_a_host_without_working_cuda_fails_by_name():
    with pytest.raises(RuntimeError, match=r"the job runs nccl, but CUDA is not available on \S+"):
        use_cuda("nccl", cuda_available=False)


def test_outside_train_yml_the_hardware_decides():
    assert use_cuda("", cuda_available=True) is True
    assert use_cuda("", cuda_available=False) is False


def test_an_unknown_backend_is_refused():
    with pytest.raises(ValueError, match=f"{ENV['backend']} must be nccl or gloo, got 'mpi'"):
        use_cuda("mpi", cuda_available=False)
