"""roles/pytorch/files/venv_state.py tells a broken venv (an install killed halfway)
from a good one, so the pytorch role removes it and installs again. The kill itself is
caused for real in molecule/faults (prepare); these are the states it can leave.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import REPO

SCRIPT = REPO / "roles/pytorch/files/venv_state.py"
PYTHON = "/usr/bin/python3"  # the nodes' system Python runs the script


def state(venv: Path, tmp_path: Path) -> dict:
    out = subprocess.run([PYTHON, str(SCRIPT), str(venv), str(tmp_path / "marker")],
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


def test_venv_without_pip_is_broken(tmp_path: Path) -> None:
    # venv creation killed during ensurepip
    s = state(make_venv(tmp_path / "venv"), tmp_path)
    assert s["broken"] == "it has no pip"


def test_torch_listed_but_not_importable_is_broken(tmp_path: Path) -> None:
    venv = make_venv(tmp_path / "venv")
    (venv / "bin" / "pip").write_text("#!/bin/sh\n")
    fake_dist(venv, "torch", "2.14.1")
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
    # killed before torch's metadata was written: pip installs over it, nothing to remove
    venv = make_venv(tmp_path / "venv")
    (venv / "bin" / "pip").write_text("#!/bin/sh\n")
    fake_dist(venv, "numpy", "2.3.0")
    s = state(venv, tmp_path)
    assert s["broken"] is None and "torch" not in s["packages"]


def test_good_venv_reports_what_torch_says(tmp_path: Path) -> None:
    # The controller venv of `make setup` holds the same torch the nodes get.
    venv = REPO / ".venv"
    s = state(venv, tmp_path)
    assert s["broken"] is None, s
    assert s["torch"]["torch"].split("+")[0] == s["packages"]["torch"].split("+")[0]
    assert s["torch"]["torchvision"].split("+")[0] == s["packages"]["torchvision"].split("+")[0]
    import torch

    assert s["torch"]["devices"] == torch.cuda.device_count()
