"""Prints, as JSON, what a node has: its Python and platform (to choose the
wheels for it) and what the venv holds (to skip pip when nothing would change),
and whether the venv is broken: an install killed halfway (provision.yml
interrupted, a node crash) can leave a venv without pip, or torch's files
half unpacked, which pip would not repair on its own.
Runs with the system python3 on the node: pytorch/tasks/main.yml.

usage: python3 venv_state.py VENV MARKER
"""

import json
import os
import platform
import subprocess
import sys

venv, marker = sys.argv[1], sys.argv[2]
python = os.path.join(venv, "bin", "python")
state = {
    "python": "{}.{}".format(*sys.version_info[:2]),
    "machine": platform.machine(),
    "glibc": platform.libc_ver()[1],
    "venv": os.path.exists(python),
    "packages": {},
    "training_hash": None,
    "broken": None,
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
if state["venv"] and not state["broken"] and "torch" in state["packages"]:
    # Metadata can be complete while files are not: import for real. What the
    # import reports is what the role checks against the matrix, so a run that
    # installs nothing imports torch once.
    modules = "torch, torchvision" + (", torchrig" if state["training_hash"] else "")
    report = (
        f"import json, {modules};"
        "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda,"
        " 'torchvision': torchvision.__version__, 'devices': torch.cuda.device_count()}))"
    )
    check = subprocess.run([python, "-c", report], check=False, capture_output=True, text=True)
    if check.returncode != 0:
        lines = check.stderr.strip().splitlines() or ["no error output"]
        state["broken"] = f"import {modules} fails: {lines[-1]}"
    else:
        state["torch"] = json.loads(check.stdout)
print(json.dumps(state))
