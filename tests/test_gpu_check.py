"""bench/gpu_check.py, the GPU smoke check, run whole on the CPU (--cpu): its steps, and
the stack it reads from the compatibility matrix, cannot go stale between GPU runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "bench" / "gpu_check.py"


def test_gpu_check_runs_on_the_cpu(tmp_path: Path) -> None:
    import torch

    env = {**os.environ, "OUT": str(tmp_path), "TMPDIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--cpu"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    print(proc.stdout)  # the figures, shown with pytest -s
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "gpu_check: every check passed" in proc.stdout
    figures = json.loads((tmp_path / "gpu_check.json").read_text())
    # The row is the matrix's own for this torch build: no version is written in the script.
    matrix = yaml.safe_load((REPO / "roles/preflight/files/compat_matrix.yml").read_text())
    base = torch.__version__.split("+")[0]
    assert any(r["torch"] == base for r in matrix["rows"])
    assert figures["matrix row"].startswith(f"torch {base} ")
    assert base not in SCRIPT.read_text()
    for step in ("allreduce ran", "mnist5k defaults ran", "resnet18 synthetic channels-last ran",
                 "resume", "torchvision", "python"):
        assert figures[f"check {step}"].startswith("ok"), (step, figures)
    assert figures["allreduce"].startswith("gloo, world 1")
    # Killed at a checkpoint (every 5 steps on the CPU) before its last step (60), then
    # resumed from the newest one and finished.
    newest = figures["kill at checkpoints"][-1]
    assert newest % 5 == 0 and newest < 60, figures
    assert f"resumed from {newest}," in figures["check resume"], figures
    assert figures["check resume"].endswith("finished at step 60)"), figures


def test_gpu_check_is_short_and_patches_nothing() -> None:
    text = SCRIPT.read_text()
    assert len(text.splitlines()) <= 200
    for patching in ("runpy", "monkeypatch", "sys.modules[", "tdata.", "setattr("):
        assert patching not in text, patching
