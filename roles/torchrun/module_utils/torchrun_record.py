"""What the fetch reads of a job's run on the node as root before it lists the job's files:
the unit's journal, the run's id and who owns the run directory.

Plain functions, imported by the torchrun_run_record module and unit-tested in
tests/test_torchrun_fetch.py (no Ansible import: pytest loads this file by path).
"""

from __future__ import annotations

import os
import pwd
import stat
import subprocess


def journal(unit: str) -> list[str]:
    """The unit's journal lines; CalledProcessError when journalctl cannot read it."""
    out = subprocess.run(["journalctl", f"--unit={unit}", "--output=short-iso-precise", "--no-pager"],
                         check=True, capture_output=True, text=True, errors="replace")
    return out.stdout.splitlines()


def run_id(path: str | None) -> str:
    """The first line of the run id file, stripped; '' when there is no path or no file."""
    if not path:
        return ""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.readline(256).strip()
    except OSError:
        return ""


def run_dir(path: str) -> dict:
    """isdir and owner of path, without following a link."""
    try:
        st = os.lstat(path)
    except OSError:
        return {"isdir": False, "owner": ""}
    if not stat.S_ISDIR(st.st_mode):
        return {"isdir": False, "owner": ""}
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:  # a user removed since: the fetch then reads as the job's user
        owner = ""
    return {"isdir": True, "owner": owner}
