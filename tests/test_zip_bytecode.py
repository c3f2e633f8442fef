"""The cache of code compiled from zip imports (roles/local_cluster/files/
torchrig_zip_bytecode.py) that the node image and the controller venv carry, run as
Ansible's modules run: a fresh Python per task, importing a package from a zip in a new
temporary directory each time."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path

CACHE_MODULE = Path(__file__).resolve().parent.parent / "roles/local_cluster/files/torchrig_zip_bytecode.py"

# Imports pkg.util from ZIP with the cache at CACHE installed (unless the uid is given),
# then reports whether the cache was in use, util's answer, and the file a traceback names.
RUN = """
import importlib.util, json, os, sys, traceback
spec = importlib.util.spec_from_file_location("torchrig_zip_bytecode", {module!r})
cache = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cache)
if len(sys.argv) > 3:
    os.setuid(int(sys.argv[3]))
used = cache.install(sys.argv[2])
sys.path.insert(0, sys.argv[1])
from pkg import util
try:
    util.fail()
except RuntimeError:
    where = traceback.extract_tb(sys.exc_info()[2])[-1].filename
print(json.dumps({{"used": used, "answer": util.ANSWER, "where": where}}))
"""


def make_zip(directory: Path, answer: int) -> Path:
    directory.mkdir(parents=True)
    path = directory / "payload.zip"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("pkg/__init__.py", "")
        z.writestr("pkg/util.py", f"ANSWER = {answer}\n\ndef fail():\n    raise RuntimeError('from util')\n")
    return path


def run(zip_path: Path, cache: Path, *uid: str) -> dict:
    argv = [sys.executable, "-S", "-c", RUN.format(module=str(CACHE_MODULE)), str(zip_path), str(cache), *uid]
    # PYTHONDONTWRITEBYTECODE keeps __pycache__ out of source trees; it does not turn this cache off.
    proc = subprocess.run(argv, capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


# Like the rest of the suite (podman), these run as root; two of them bring in another user.
def test_a_second_task_loads_the_code_the_first_compiled_and_names_its_own_zip(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = run(make_zip(tmp_path / "task1", 42), cache)
    # A compile writes a new file in place of the old: the inodes tell.
    kept = sorted((p.name, p.stat().st_ino) for p in cache.iterdir())
    assert first == {"used": True, "answer": 42, "where": str(tmp_path / "task1/payload.zip/pkg/util.py")}
    assert len(kept) == 2, kept  # pkg/__init__.py and pkg/util.py
    assert oct(cache.stat().st_mode & 0o777) == "0o700"

    second = run(make_zip(tmp_path / "task2", 42), cache)
    assert second == {"used": True, "answer": 42, "where": str(tmp_path / "task2/payload.zip/pkg/util.py")}
    assert sorted((p.name, p.stat().st_ino) for p in cache.iterdir()) == kept, "the second task compiled again"


def test_a_changed_source_is_compiled_anew(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    assert run(make_zip(tmp_path / "old", 1), cache)["answer"] == 1
    assert run(make_zip(tmp_path / "new", 2), cache)["answer"] == 2
    assert len(list(cache.iterdir())) == 3  # one __init__, util twice


def test_a_cache_others_can_write_to_is_not_used(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o777)
    cache.chmod(0o777)
    assert run(make_zip(tmp_path / "task", 7), cache) == {
        "used": False, "answer": 7, "where": str(tmp_path / "task/payload.zip/pkg/util.py")}
    assert list(cache.iterdir()) == []


def test_another_user_compiles_as_python_does(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    # Where nobody (65534) can read the zip: pytest's own directories are root's only.
    shared = Path(tempfile.mkdtemp(prefix="torchrig-zip-bytecode-"))
    try:
        shared.chmod(0o755)
        zip_path = make_zip(shared / "task", 9)
        (shared / "task").chmod(0o755)
        zip_path.chmod(0o644)
        assert run(zip_path, cache, "65534") == {"used": False, "answer": 9, "where": str(zip_path / "pkg/util.py")}
    finally:
        shutil.rmtree(shared)
    assert not cache.exists()


def test_a_cache_of_another_user_is_not_used(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    os.chown(cache, 65534, 65534)
    assert run(make_zip(tmp_path / "task", 5), cache)["used"] is False
    assert list(cache.iterdir()) == []


def test_the_controller_venv_keeps_a_localhost_tasks_module_compiled() -> None:
    """make setup gives the controller venv the cache, in the user's ~/.cache/torchrig: the
    module of a task run on localhost is loaded compiled the next time."""
    cache = Path.home() / ".cache/torchrig/zip-bytecode"  # the Makefile's $(HOME)/.cache/torchrig
    subprocess.run(["ansible", "localhost", "-m", "ansible.builtin.ping"], check=True, capture_output=True,
                   env={**os.environ, "ANSIBLE_LOCALHOST_WARNING": "false"})
    # The source the task's zip carried (not imported here: Ansible stays out of pytest's process).
    source = (Path(sysconfig.get_path("purelib")) / "ansible/module_utils/basic.py").read_bytes()
    key = hashlib.sha256(b"ansible/module_utils/basic.py\0" + source).hexdigest()
    compiled = cache / f"{key}.{sys.implementation.cache_tag}"
    assert compiled.is_file(), f"{compiled} missing: the venv's Python compiled basic.py without keeping it"
    assert cache.stat().st_uid == os.geteuid() and oct(cache.stat().st_mode & 0o777) == "0o700"
