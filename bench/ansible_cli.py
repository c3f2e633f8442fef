"""Running Ansible from the bench scripts: one way, from the repository root, with the
controller venv's tools (the interpreter that runs the bench)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def ansible(cmd: list[str], inventory: str | None = None, env: dict[str, str] | None = None,
            check: bool = True, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    """Run `ansible-playbook ...` or `ansible ...`; with check, stop the bench on failure."""
    inv = ["-i", inventory] if inventory else []
    proc = subprocess.run([str(BIN / cmd[0]), *inv, *cmd[1:]], cwd=REPO, capture_output=True,
                          text=True, check=False, timeout=timeout,
                          env={**os.environ, **(env or {})})
    if check and proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n"
                 f"{proc.stdout[-4000:]}{proc.stderr[-2000:]}")
    return proc


def on_nodes(pattern: str, shell: str, inventory: str | None = None) -> dict[str, str]:
    """Run a shell line as root on the hosts of `pattern`; host name -> its stdout.

    Hosts where the line failed are left out; the caller checks the count.
    """
    proc = ansible(["ansible", pattern, "-b", "-m", "ansible.builtin.shell", "-a", shell],
                   inventory, env={"ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
                                   "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json"}, check=False)
    hosts = json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]
    return {name: r["stdout"] for name, r in hosts.items() if r.get("rc") == 0}
