"""The torch report: the one place that asks a venv's torch what it is
(roles/pytorch/files/venv_state.py --report). The pytorch role runs it after an
install (tasks/report.yml), venv_state.py's import mode runs it before one, and
other playbooks reach it through the role's `report` entry point. Stand-in torch
and torchvision modules here; tests/test_venv_state.py runs the real ones."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import REPO

SCRIPT = REPO / "roles/pytorch/files/venv_state.py"
PYTHON = "/usr/bin/python3"

FAKE_TORCH = """__version__ = '2.14.1+cu130'
class version:
    cuda = '13.0'
class cuda:
    @staticmethod
    def device_count():
        return 8
"""


def fake_modules(where: Path, *extra: str) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    (where / "torch.py").write_text(FAKE_TORCH)
    (where / "torchvision.py").write_text("__version__ = '0.29.1+cu130'\n")
    for name in extra:
        (where / f"{name}.py").write_text("")
    return where


def report(path: Path, *modules: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, str(SCRIPT), "--report", *modules], capture_output=True,
                          text=True, timeout=120, check=False, env={"PYTHONPATH": str(path)})


def test_report_says_what_torch_says(tmp_path: Path) -> None:
    out = report(fake_modules(tmp_path / "site"))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"torch": "2.14.1+cu130", "cuda": "13.0",
                                      "torchvision": "0.29.1+cu130", "devices": 8}


def test_report_imports_the_training_package_when_asked(tmp_path: Path) -> None:
    site = fake_modules(tmp_path / "site")
    out = report(site, "torchrig")
    assert out.returncode != 0 and "No module named 'torchrig'" in out.stderr
    fake_modules(site, "torchrig")
    assert json.loads(report(site, "torchrig").stdout)["devices"] == 8


def test_import_mode_of_venv_state_runs_the_same_report(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    (venv / "bin" / "pip").write_text("#!/bin/sh\n")
    site = next((venv / "lib").glob("python3*/site-packages"))
    fake_modules(site)
    info = site / "torch-2.14.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.14.1\n")
    # A finished install: pip's RECORD, with the INSTALLER it adds (venv_state checks both).
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text("torch-2.14.1.dist-info/METADATA,,\ntorch-2.14.1.dist-info/INSTALLER,,\n"
                                 "torch-2.14.1.dist-info/RECORD,,\n")
    out = subprocess.run([PYTHON, str(SCRIPT), str(venv), str(tmp_path / "marker"), "import"],
                         capture_output=True, text=True, timeout=120, check=True)
    state = json.loads(out.stdout)
    assert state["broken"] is None, state
    assert state["torch"] == {"torch": "2.14.1+cu130", "cuda": "13.0", "torchvision": "0.29.1+cu130",
                              "devices": 8}
    # With a training package recorded, the import includes it: absent here, so broken.
    (tmp_path / "marker").write_text("abc\n")
    out = subprocess.run([PYTHON, str(SCRIPT), str(venv), str(tmp_path / "marker"), "import"],
                         capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout)["broken"].startswith(
        "import torch, torchvision, torchrig fails: ModuleNotFoundError"), out.stdout
