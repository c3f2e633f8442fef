"""Fills one wheelhouse directory on the controller with `pip download`, once.

The directory appears complete or not at all: pip downloads into a temporary
directory beside it, which is renamed when pip succeeds. Prints JSON with the
directory, its file count and its size in bytes.

usage: python fill_wheelhouse.py --dest DIR --python 3.11 --machine x86_64 --glibc 2.36
         [--index-url URL] --torch REQ [REQ ...] --deps REQ [REQ ...] --nodeps REQ [REQ ...]
"""

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile


def target_args(py, machine, glibc):
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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dest", required=True)
    p.add_argument("--python", required=True)
    p.add_argument("--machine", required=True)
    p.add_argument("--glibc", required=True)
    p.add_argument("--index-url", default="")
    p.add_argument("--torch", nargs="+", required=True)
    p.add_argument("--deps", nargs="*", default=[])
    p.add_argument("--nodeps", nargs="*", default=[])
    a = p.parse_args()

    if not os.path.isdir(a.dest):
        os.makedirs(os.path.dirname(a.dest), exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".partial-", dir=os.path.dirname(a.dest))
        try:
            pip = [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--dest",
                tmp,
                "--only-binary=:all:",
                "--progress-bar",
                "off",
            ]
            pip += target_args(a.python, a.machine, a.glibc)
            # torch and torchvision from the variant's index (PyPI when none) ...
            index = ["--index-url", a.index_url] if a.index_url else []
            subprocess.run(pip + index + a.torch, check=True, stdout=sys.stderr)
            # ... the training package's dependencies from the usual index (none
            # of them depends on torch) ...
            if a.deps:
                subprocess.run(pip + a.deps, check=True, stdout=sys.stderr)
            # ... and packages used for their data files only, without theirs.
            if a.nodeps:
                subprocess.run(pip + ["--no-deps"] + a.nodeps, check=True, stdout=sys.stderr)
            os.rename(tmp, a.dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    files = sorted(f for f in os.listdir(a.dest) if f.endswith(".whl"))
    size = sum(os.path.getsize(os.path.join(a.dest, f)) for f in files)
    print(json.dumps({"dir": a.dest, "files": len(files), "bytes": size}))


if __name__ == "__main__":
    main()
