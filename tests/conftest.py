"""Shared helpers for the playbook tests: run Ansible from the repo root."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
# The user `nobody` of Debian and most distributions.
NOBODY = 65534

T = TypeVar("T")


def as_unprivileged(fn: Callable[[], T]) -> T:
    """fn() as a user without root's powers: this process's own, or nobody when the suite
    runs as root (as CI does), where root's override of file modes would hide what a user
    meets. fn must return something pickle can carry; an exception comes back as a
    RuntimeError naming it."""
    if os.geteuid() != 0:
        return fn()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop root for good, call fn, send its result, leave
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            data = pickle.dumps((True, fn()))
        except BaseException as e:  # noqa: BLE001 - whatever it was goes back to the test
            data = pickle.dumps((False, f"{type(e).__name__}: {e}"))
        with os.fdopen(write, "wb") as out:
            out.write(data)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as got:
        data = got.read()
    os.waitpid(pid, 0)
    ok, value = pickle.loads(data)
    if not ok:
        raise RuntimeError(f"as user {os.getuid() if os.geteuid() else NOBODY}: {value}")
    return value


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A temporary directory every user may pass through (pytest's tmp_path is root's alone
    when the suite runs as root), for checks run by as_unprivileged."""
    path = Path(tempfile.mkdtemp(prefix="torchrig-test-"))
    path.chmod(0o755)
    yield path
    for sub in path.rglob("*"):
        if sub.is_dir() and not sub.is_symlink():
            sub.chmod(0o700)
    shutil.rmtree(path, ignore_errors=True)


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


# `make test` runs the modules marked `nodes` (they start local-cluster nodes of their
# own) beside the role scenarios, and the rest beside the cluster scenario on CPU time
# it leaves over: their runs there are slowed, never timed. A module that starts nodes
# unmarked would take that scenario's CPU, so it is refused here, by name.
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "nodes: the module starts local-cluster nodes (podman) of its own")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    modules = {item.path: item for item in items}
    unmarked = sorted(path.name for path, item in modules.items()
                      if "playbooks/local-cluster.yml" in path.read_text() and not item.get_closest_marker("nodes"))
    if unmarked:
        raise pytest.UsageError(f"{', '.join(unmarked)}: starts local-cluster nodes but is not marked `nodes`; "
                                "add `pytestmark = pytest.mark.nodes`")
