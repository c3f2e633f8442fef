"""Precision and GPU choice as pure functions of the hardware: no GPU needed."""

from __future__ import annotations

import os

import pytest
import torch

from torchrig import dist
from torchrig.config import parse_config
from torchrig.data import UsageError
from torchrig.train import choose_precision, main


@pytest.mark.parametrize("capability,expected", [
    ((12, 0), "bf16"),  # Blackwell workstation
    ((10, 0), "bf16"),  # B200
    ((9, 0), "bf16"),   # H100, H200
    ((8, 6), "bf16"),   # RTX 3090, A40
    ((8, 0), "bf16"),   # A100
    ((7, 5), "fp16"),   # T4: bf16 only emulated
    ((7, 0), "fp16"),   # V100
    ((6, 1), "fp32"),   # GTX 1080, P40: slow fp16
    ((6, 0), "fp32"),   # P100
    ((5, 2), "fp32"),
    (None, "fp32"),     # the CPU
])
def test_auto_precision_by_compute_capability(capability, expected):
    assert choose_precision("auto", capability) == expected


@pytest.mark.parametrize("requested", ["fp32", "fp16", "bf16"])
def test_explicit_precision_where_the_hardware_has_it(requested):
    assert choose_precision(requested, (9, 0)) == requested
    assert choose_precision(requested, None) == requested  # the CPU autocasts all three


def test_bf16_without_bf16_hardware_is_an_error():
    with pytest.raises(UsageError, match=r"--precision bf16: this GPU \(compute capability "
                                         r"7\.5\) has no bf16 hardware, which starts at 8\.0"):
        choose_precision("bf16", (7, 5))
    assert choose_precision("fp16", (7, 5)) == "fp16"
    assert choose_precision("fp32", (6, 0)) == "fp32"


def test_one_gpu_per_process():
    assert [dist.gpu_index(r, 8, 8) for r in range(8)] == list(range(8))
    assert dist.gpu_index(1, 2, 4) == 1  # fewer processes than GPUs is fine


def test_more_processes_than_gpus_is_an_error(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    expected = (r"this node runs 4 processes \(torchrun --nproc-per-node, LOCAL_WORLD_SIZE\) "
                r"but 2 GPU\(s\) are visible \(CUDA_VISIBLE_DEVICES=0,1\): two processes "
                r"would share a GPU. Needs: --nproc-per-node 2 or fewer")
    with pytest.raises(dist.DeviceError, match=expected):
        dist.gpu_index(3, 4, 2)


def test_trainer_exits_2_when_a_node_has_fewer_gpus_than_processes(monkeypatch, tmp_path, capsys):
    # What torchrun gives the 3rd of 3 workers on a node that shows 2 GPUs.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert main(["--run-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "torchrig-train: error: this node runs 3 processes" in err
    assert "but 2 GPU(s) are visible: two processes would share a GPU" in err


def test_deterministic_flag(monkeypatch):
    assert parse_config([]).deterministic is False
    assert parse_config(["--deterministic"]).deterministic is True
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    was = (torch.are_deterministic_algorithms_enabled(),
           torch.is_deterministic_algorithms_warn_only_enabled())
    try:
        dist.make_deterministic()
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
        assert not torch.backends.cudnn.benchmark and torch.backends.cudnn.deterministic
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    finally:
        torch.use_deterministic_algorithms(was[0], warn_only=was[1])
        torch.backends.cudnn.deterministic = False
