"""Shared helpers for the playbook tests: run Ansible from the repo root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent


def run(cmd: list[str], *, env: dict[str, str] | None = None, timeout: int = 600,
        check: bool = False) -> subprocess.CompletedProcess[str]:
    """Run a command from the repo root with the venv's tools first on PATH."""
    full_env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}",
                "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_NOCOLOR": "1"}
    full_env.update(env or {})
    proc = subprocess.run(cmd, check=False, cwd=REPO, env=full_env, capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def podman_names(kind: str, prefix: str) -> list[str]:
    """Names of podman containers or networks that start with prefix."""
    if kind == "container":
        out = run(["podman", "ps", "-a", "--format", "{{.Names}}"], check=True).stdout
    else:
        out = run(["podman", "network", "ls", "--format", "{{.Name}}"], check=True).stdout
    return [name for name in out.split() if name.startswith(prefix)]


@pytest.fixture
def repo() -> Path:
    return REPO
