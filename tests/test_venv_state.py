"""roles/pytorch/files/venv_state.py tells a broken venv (an install killed halfway)
from a good one, so the pytorch role removes it and installs again. The kill itself is
caused for real in the molecule cluster scenario (prepare); these are the states it can leave.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import REPO

SCRIPT = REPO / "roles/pytorch/files/venv_state.py"
PYTHON = "/usr/bin/python3"  # the nodes' system Python runs the script


def state(venv: Path, tmp_path: Path, mode: str = "import", *leftovers: Path) -> dict:
    out = subprocess.run([PYTHON, str(SCRIPT), str(venv), str(tmp_path / "marker"), mode,
                          *map(str, leftovers)],
                         capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout)


def make_venv(path: Path) -> Path:
    subprocess.run([PYTHON, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    return path


def site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def fake_dist(venv: Path, name: str, version: str) -> None:
    """The metadata pip writes last: a package pip takes as installed."""
    info = site_packages(venv) / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_no_venv_is_not_broken(tmp_path: Path) -> None:
    s = state(tmp_path / "none", tmp_path)
    assert s["venv"] is False and s["broken"] is None


def test_reports_which_pushed_wheel_dirs_an_earlier_run_left(tmp_path: Path) -> None:
    # The role removes only these when it pushes nothing this run.
    left, gone = tmp_path / "wheelhouse", tmp_path / "training"
    (left / "torch-2.14.1-cp311-none-any.whl").mkdir(parents=True)
    assert state(tmp_path / "none", tmp_path, "files", left, gone)["leftovers"] == [str(left)]
    assert state(tmp_path / "none", tmp_path, "files")["leftovers"] == []


def test_venv_without_pip_is_broken(tmp_path: Path) -> None:
    # venv creation killed during ensurepip
    s = state(make_venv(tmp_path / "venv"), tmp_path)
    assert s["broken"] == "it has no pip"


def test_torch_listed_but_not_importable_is_broken(tmp_path: Path) -> None:
    venv = make_venv(tmp_path / "venv")
    recorded_dist(venv, {})  # pip's records complete, yet no torch module: only the import tells
    s = state(venv, tmp_path)
    assert s["packages"]["torch"] == "2.14.1"
    assert s["broken"].startswith("import torch, torchvision fails: ModuleNotFoundError"), s


def test_python_that_does_not_run_is_broken(tmp_path: Path) -> None:
    venv = make_venv(tmp_path / "venv")
    (venv / "bin" / "python").unlink()
    (venv / "bin" / "python").write_text("")  # truncated by a crash: exec format error
    (venv / "bin" / "python").chmod(0o755)
    s = state(venv, tmp_path)
    assert s["broken"].startswith("its python does not run"), s


def test_venv_without_torch_yet_is_not_broken(tmp_path: Path) -> None:
    # killed before torch's metadata was written, its companions whole: pip installs torch over it
    venv = make_venv(tmp_path / "venv")
    (venv / "bin" / "pip").write_text("#!/bin/sh\n")
    for mode in ("import", "files"):
        s = state(venv, tmp_path, mode)
        assert s["broken"] is None and "torch" not in s["packages"], s


@pytest.mark.parametrize("mode", ["import", "files"])
def test_a_companion_cut_short_before_torch_is_broken(tmp_path: Path, mode: str) -> None:
    # Seen in the cluster scenario: killed while numpy was unpacked, before torch. pip takes
    # numpy (its metadata is there) as installed and would never mend it, so the venv goes.
    venv = make_venv(tmp_path / "venv")
    (venv / "bin" / "pip").write_text("#!/bin/sh\n")
    fake_dist(venv, "numpy", "2.3.0")
    assert state(venv, tmp_path, mode)["broken"] == "numpy-2.3.0.dist-info has no RECORD (its install did not finish)"


def test_good_venv_reports_what_torch_says(tmp_path: Path) -> None:
    # The controller venv of `make setup` holds the same torch the nodes get.
    venv = REPO / ".venv"
    s = state(venv, tmp_path)
    assert s["broken"] is None, s
    assert s["torch"]["torch"].split("+")[0] == s["packages"]["torch"].split("+")[0]
    assert s["torch"]["torchvision"].split("+")[0] == s["packages"]["torchvision"].split("+")[0]
    import torch

    assert s["torch"]["devices"] == torch.cuda.device_count()


# --- files mode: pip's RECORD instead of an import (CPU hosts) ---------------------------

def recorded_dist(venv: Path, files: dict[str, bytes]) -> Path:
    """torch as pip leaves it: its files, then RECORD (path, hash, size) written last."""
    (venv / "bin" / "pip").write_text("#!/bin/sh\n")
    fake_dist(venv, "torch", "2.14.1")
    site = site_packages(venv)
    for rel, data in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
    rows = [f"{rel},sha256=x,{len(data)}" for rel, data in files.items()]
    (site / "torch-2.14.1.dist-info" / "INSTALLER").write_text("pip\n")
    (site / "torch-2.14.1.dist-info" / "RECORD").write_text("\n".join(
        [*rows, "torch-2.14.1.dist-info/INSTALLER,sha256=x,4", "torch-2.14.1.dist-info/RECORD,,"]) + "\n")
    return site


TORCH_FILES = {"torch/__init__.py": b"# torch\n", "torch/lib/libtorch_cpu.so": b"\0" * 4096,
               "torch/version.py": b"__version__ = '2.14.1+cu130'\ncuda: Optional[str] = '13.0'\n"}


def test_files_mode_reads_versions_without_importing(tmp_path: Path) -> None:
    venv = make_venv(tmp_path / "venv")
    recorded_dist(venv, TORCH_FILES)
    s = state(venv, tmp_path, "files")
    assert s["broken"] is None, s
    assert s["torch"] == {"torch": "2.14.1+cu130", "torchvision": "", "cuda": "13.0", "devices": None}


def test_files_mode_finds_a_short_or_missing_file(tmp_path: Path) -> None:
    venv = make_venv(tmp_path / "venv")
    site = recorded_dist(venv, TORCH_FILES)
    (site / "torch/lib/libtorch_cpu.so").write_bytes(b"\0" * 1000)  # unpacking was cut short
    assert state(venv, tmp_path, "files")["broken"] == (
        "torch/lib/libtorch_cpu.so of torch-2.14.1.dist-info has 1000 bytes, not 4096")
    (site / "torch/lib/libtorch_cpu.so").unlink()
    assert state(venv, tmp_path, "files")["broken"] == (
        "torch/lib/libtorch_cpu.so of torch-2.14.1.dist-info is missing")


def test_files_mode_takes_a_dist_without_record_as_unfinished(tmp_path: Path) -> None:
    venv = make_venv(tmp_path / "venv")
    (venv / "bin" / "pip").write_text("#!/bin/sh\n")
    fake_dist(venv, "torch", "2.14.1")  # metadata unpacked, killed before RECORD
    assert state(venv, tmp_path, "files")["broken"] == (
        "torch-2.14.1.dist-info has no RECORD (its install did not finish)")


def test_files_mode_takes_the_wheels_own_record_as_unfinished(tmp_path: Path) -> None:
    venv = make_venv(tmp_path / "venv")
    site = recorded_dist(venv, TORCH_FILES)
    record = site / "torch-2.14.1.dist-info" / "RECORD"  # as unpacked, before pip rewrote it
    record.write_text("".join(line + "\n" for line in record.read_text().splitlines()
                              if "INSTALLER" not in line))
    assert state(venv, tmp_path, "files")["broken"] == (
        "torch-2.14.1.dist-info has the wheel's RECORD only (its install did not finish)")


def test_files_mode_agrees_with_the_import_on_a_good_venv(tmp_path: Path) -> None:
    venv = REPO / ".venv"
    by_files, by_import = state(venv, tmp_path, "files"), state(venv, tmp_path)
    assert by_files["broken"] is None and by_import["broken"] is None, (by_files, by_import)
    for key in ("torch", "torchvision", "cuda"):
        assert by_files["torch"][key] == by_import["torch"][key]
