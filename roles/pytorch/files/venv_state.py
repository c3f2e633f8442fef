"""Prints, as JSON, what a node has: its Python and platform (to choose the
wheels for it) and what the venv holds (to skip pip when nothing would change),
and whether the venv is broken: an install killed halfway (provision.yml
interrupted, a node crash) can leave a venv without pip, or torch's files
half unpacked, which pip would not repair on its own.
Runs with the system python3 on the node: pytorch/tasks/venv.yml.

usage: python3 venv_state.py VENV MARKER [import|files] [LEFTOVER...]

LEFTOVER: paths an earlier run may have left behind (the pushed wheels);
"leftovers" lists those that exist, so a run that pushes nothing removes
nothing it need not look for.

How the venv's torch is checked:
- import (the default): import torch and torchvision for real, and report
  what torch says, GPUs included. Seconds of CPU on every run.
- files: every file pip's RECORD lists, for every package, exists at its
  recorded size; torch's version and CUDA build are read from its files. A
  killed install leaves a file missing or short, or a RECORD that pip has
  not rewritten yet (it does that last). Milliseconds; used where there are no GPUs for torch to count.

The torch report (the one place that asks torch what it is; every check of an
installed venv runs this file):

usage: VENV/bin/python venv_state.py --report [MODULE...]

imports torch, torchvision and each MODULE (torchrig) and prints, as JSON,
{"torch": torch.__version__, "cuda": torch.version.cuda,
 "torchvision": torchvision.__version__, "devices": torch.cuda.device_count()}.
The import mode above runs the venv's python on this same file with --report.
"""

import csv
import glob
import json
import os
import platform
import re
import subprocess
import sys


def incomplete_files(site_packages):
    """The first problem with the files pip recorded, or None when every one is whole."""
    for info in sorted(glob.glob(os.path.join(site_packages, "*.dist-info"))):
        record = os.path.join(info, "RECORD")
        if not os.path.exists(record):
            return f"{os.path.basename(info)} has no RECORD (its install did not finish)"
        with open(record, newline="") as f:
            rows = [row for row in csv.reader(f) if len(row) == 3]  # path, hash, size
        # The wheel brings a RECORD of its own; pip rewrites it last, adding the
        # INSTALLER file and the scripts (bin/torchrun) it made.
        if not any(path.endswith(".dist-info/INSTALLER") for path, _, _ in rows):
            return f"{os.path.basename(info)} has the wheel's RECORD only (its install did not finish)"
        for path, _, size in rows:
            full = os.path.normpath(os.path.join(site_packages, path))
            try:
                found = os.path.getsize(full)
            except OSError:
                return f"{path} of {os.path.basename(info)} is missing"
            if size and found != int(size):
                return f"{path} of {os.path.basename(info)} has {found} bytes, not {size}"
    return None


def torch_from_files(site_packages, packages):
    """What the import would report, from torch's and torchvision's version.py."""

    def field(package, name):
        path = os.path.join(site_packages, package, "version.py")
        if not os.path.exists(path):
            return packages.get(package, "") if name == "__version__" else None
        with open(path) as f:
            found = re.search(rf"^{name}\b[^=]*=\s*(?:'([^']*)'|None)", f.read(), re.MULTILINE)
        return found.group(1) if found else None

    return {"torch": field("torch", "__version__"), "torchvision": field("torchvision", "__version__"),
            "cuda": field("torch", "cuda"), "devices": None}


def torch_report(modules):
    """What torch says it is: run by the venv's python (--report)."""
    import importlib

    found = {name: importlib.import_module(name) for name in ["torch", "torchvision", *modules]}
    torch = found["torch"]
    return {"torch": torch.__version__, "cuda": torch.version.cuda,
            "torchvision": found["torchvision"].__version__, "devices": torch.cuda.device_count()}


def import_report(python, training):
    """(report, None), or (None, why the venv is broken) when the import fails."""
    extra = ["torchrig"] if training else []
    modules = ", ".join(["torch", "torchvision", *extra])
    check = subprocess.run([python, os.path.abspath(__file__), "--report", *extra],
                           check=False, capture_output=True, text=True)
    if check.returncode != 0:
        lines = check.stderr.strip().splitlines() or ["no error output"]
        return None, f"import {modules} fails: {lines[-1]}"
    return json.loads(check.stdout.strip().splitlines()[-1]), None


def main(argv):
    venv, marker = argv[1], argv[2]
    mode = argv[3] if len(argv) > 3 else "import"
    leftovers = argv[4:]
    python = os.path.join(venv, "bin", "python")
    state = {
        "python": "{}.{}".format(*sys.version_info[:2]),
        "machine": platform.machine(),
        "glibc": platform.libc_ver()[1],
        "venv": os.path.exists(python),
        "packages": {},
        "training_hash": None,
        "broken": None,
        "leftovers": [path for path in leftovers if os.path.lexists(path)],
    }
    if state["venv"]:
        # importlib.metadata reads the dist-info files: milliseconds, where
        # importing torch would take seconds.
        listing = (
            "import importlib.metadata as m, json;"
            "print(json.dumps({d.metadata['Name'].lower().replace('_', '-'): d.version for d in m.distributions()}))"
        )
        try:
            state["packages"] = json.loads(subprocess.check_output([python, "-c", listing]))
        except (OSError, subprocess.CalledProcessError, ValueError) as e:
            state["broken"] = f"its python does not run: {e}"
        if not state["broken"] and not os.path.exists(os.path.join(venv, "bin", "pip")):
            state["broken"] = "it has no pip"
    if os.path.exists(marker):
        with open(marker) as f:
            state["training_hash"] = f.read().strip()
    site = next(iter(glob.glob(os.path.join(venv, "lib", "python3*", "site-packages"))), None)
    if state["venv"] and not state["broken"] and site:
        # Any package, torch or not: pip takes one whose metadata is there as
        # installed ("Requirement already satisfied") and would never mend its
        # files. A kill can cut any package short, not only torch.
        state["broken"] = incomplete_files(site)
    if state["venv"] and not state["broken"] and "torch" in state["packages"] and mode == "files":
        try:
            state["torch"] = torch_from_files(site, state["packages"])
        except OSError as e:
            state["broken"] = f"a version file cannot be read: {e}"
    elif state["venv"] and not state["broken"] and "torch" in state["packages"]:
        # Metadata can be complete while files are not: import for real. What the
        # import reports is what the role checks against the matrix, so a run that
        # installs nothing imports torch once.
        report, state["broken"] = import_report(python, state["training_hash"])
        if report is not None:
            state["torch"] = report
    return state


if __name__ == "__main__":
    if sys.argv[1:2] == ["--report"]:
        print(json.dumps(torch_report(sys.argv[2:])))
    else:
        print(json.dumps(main(sys.argv)))
