"""pip's flags for downloading wheels on the controller for the nodes' Python and platform.

Imported by name (torchrig.cluster's module_utils) by the pytorch role's fill_wheelhouse.py
(the stack's wheelhouse) and the torchrun role's job_venv.py (a job's own requirements):
both download on the controller what the nodes install offline.
"""

from __future__ import annotations

import platform
import sys


def target_args(py: str, machine: str, glibc: str) -> list[str]:
    """pip flags for the nodes' Python and platform, when they differ from this machine's."""
    here = ("{}.{}".format(*sys.version_info[:2]), platform.machine(), platform.libc_ver()[1])
    if (py, machine, glibc) == here:
        return []
    major, minor = (int(x) for x in glibc.split(".")[:2])
    tags = [f"manylinux_{major}_{m}_{machine}" for m in range(minor, 16, -1)]
    tags.append(f"manylinux2014_{machine}")
    args = ["--only-binary=:all:", "--implementation", "cp", "--python-version", py]
    for tag in tags:
        args += ["--platform", tag]
    return args
