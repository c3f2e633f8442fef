"""A job's one backend (roles/torchrun/filter_plugins/torchrun_backend.py): nccl only
when every host has GPUs; a mix of GPU and CPU hosts refused by name."""

import pytest
from rolepy import load

backend = load("roles/torchrun/filter_plugins/torchrun_backend.py", "torchrun_backend")


def test_every_host_with_gpus_runs_nccl():
    assert backend.job_backend({"gpu1": 8, "gpu2": "8"}, "j", "cpu_nodes") == "nccl"


def test_cpu_hosts_run_gloo_even_when_the_cpu_group_hides_their_gpus():
    # torchrun_gpus is 0 for a host of the CPU group, whatever its driver sees.
    assert backend.job_backend({"node1": 0, "node2": "0"}, "j", "cpu_nodes") == "gloo"


def test_a_mix_is_refused_naming_both_kinds_and_the_way_out():
    with pytest.raises(backend.BackendError) as e:
        backend.job_backend({"gpu1": 8, "cpu1": 0, "gpu2": 4}, "mnist", "cpu_nodes")
    assert str(e.value).startswith("Job mnist would run on GPU hosts (gpu1, gpu2) and CPU hosts (cpu1)")
    assert "add the GPU hosts to the cpu_nodes group" in str(e.value)
    assert str(e.value).endswith("No job was started.")
