"""Prints, as JSON, what a node has: its Python and platform (to choose the
wheels for it) and what the venv holds (to skip pip when nothing would change).
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
}
if state["venv"]:
    # importlib.metadata reads the dist-info files: milliseconds, where
    # importing torch would take seconds.
    listing = (
        "import importlib.metadata as m, json;"
        "print(json.dumps({d.metadata['Name'].lower().replace('_', '-'): d.version for d in m.distributions()}))"
    )
    state["packages"] = json.loads(subprocess.check_output([python, "-c", listing]))
if os.path.exists(marker):
    with open(marker) as f:
        state["training_hash"] = f.read().strip()
print(json.dumps(state))
