"""The cache of Ansible's import scans (roles/local_cluster/files/torchrig_ansiballz_scan.py)
that the controller venv carries, run as a user runs playbooks: real ansible-playbook runs of
a module of a project's own, whose module_utils change between runs."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

from ansible.release import __version__ as ANSIBLE_VERSION

SCAN_MODULE = Path(__file__).resolve().parent.parent / "roles/local_cluster/files/torchrig_ansiballz_scan.py"

# ansible-playbook with the cache at argv[1] and nothing else of the venv's .pth files
# (-S): the remaining arguments are ansible-playbook's.
RUN = """
import importlib.util, sys
sys.path.append({purelib!r})
spec = importlib.util.spec_from_file_location("torchrig_ansiballz_scan", {module!r})
scan = importlib.util.module_from_spec(spec)
spec.loader.exec_module(scan)
scan.install(sys.argv[1])
sys.argv = ["ansible-playbook", *sys.argv[2:]]
from ansible.cli.playbook import main
main()
"""

PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Ask the project's module
      probe:
      register: probe
    - name: Say what it answered
      ansible.builtin.debug:
        msg: "answer={{ probe.answer }}"
"""

MODULE = """
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.probe_util import ANSWER

AnsibleModule(argument_spec={}).exit_json(answer=ANSWER)
"""


def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "library").mkdir(parents=True)
    (root / "module_utils").mkdir()
    (root / "library/probe.py").write_text(MODULE)
    (root / "module_utils/probe_util.py").write_text("ANSWER = 1\n")
    (root / "play.yml").write_text(PLAY)
    return root


def run(root: Path, cache: Path) -> str:
    argv = [sys.executable, "-S", "-c", RUN.format(purelib=sysconfig.get_path("purelib"), module=str(SCAN_MODULE)),
            str(cache), "-i", "localhost,", "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}",
            str(root / "play.yml")]
    env = {**os.environ, "ANSIBLE_LIBRARY": str(root / "library"), "ANSIBLE_MODULE_UTILS": str(root / "module_utils"),
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCAL_TEMP": str(root / "tmp")}
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, env=env, cwd=root)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return next(line.split('"')[-2] for line in proc.stdout.splitlines() if '"msg": "answer=' in line)


def entries(cache: Path) -> dict[str, int]:
    return {p.name: p.stat().st_ino for p in cache.iterdir()}


def test_a_second_run_reuses_the_first_runs_scans(tmp_path: Path) -> None:
    root, cache = project(tmp_path), tmp_path / "cache"
    assert run(root, cache) == "answer=1"
    first = entries(cache)
    assert len(first) > 5, first  # the module, basic and its companions, probe_util
    for path in cache.iterdir():
        scan = json.loads(path.read_text())
        assert set(scan) == {"submodules", "optional_imports"}
    assert run(root, cache) == "answer=1"
    assert entries(cache) == first  # nothing scanned and written again


def test_a_changed_module_util_is_scanned_anew(tmp_path: Path) -> None:
    root, cache = project(tmp_path), tmp_path / "cache"
    assert run(root, cache) == "answer=1"
    # probe_util now needs a module_util the first scan never saw: a stale scan would leave
    # it out of the module's zip, and the module would fail to import it.
    (root / "module_utils/probe_extra.py").write_text("EXTRA = 2\n")
    (root / "module_utils/probe_util.py").write_text(
        "from ansible.module_utils.probe_extra import EXTRA\nANSWER = EXTRA\n")
    assert run(root, cache) == "answer=2"


def test_a_cache_others_can_write_to_is_not_used(tmp_path: Path) -> None:
    root, cache = project(tmp_path), tmp_path / "cache"
    cache.mkdir(mode=0o700)
    cache.chmod(0o777)
    assert run(root, cache) == "answer=1"
    assert list(cache.iterdir()) == []


def test_the_controller_venv_keeps_its_scans() -> None:
    """The venv of make setup installs the cache by its .pth: a task run through it leaves
    the scan of ansible.module_utils.basic under ~/.cache/torchrig/ansiballz-scan."""
    subprocess.run(["ansible", "localhost", "-m", "ansible.builtin.ping"], check=True, capture_output=True,
                   env={**os.environ, "ANSIBLE_PYTHON_INTERPRETER": sys.executable})
    source = (Path(sysconfig.get_path("purelib")) / "ansible/module_utils/basic.py").read_bytes()
    salt = f"scan-v1\0{ANSIBLE_VERSION}\0{sys.version_info[0]}.{sys.version_info[1]}\0".encode()
    key = hashlib.sha256(salt + b"ansible.module_utils.basic\x000\x00" + source).hexdigest()
    scan = json.loads((Path.home() / f".cache/torchrig/ansiballz-scan/{key}.json").read_text())
    # basic.py's "from ansible.module_utils.common.text.converters import to_bytes", as Ansible records it.
    assert ["ansible", "module_utils", "common", "text", "converters", "to_bytes"] in scan["submodules"], scan
