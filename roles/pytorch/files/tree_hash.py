"""Prints a SHA-256 over the names and contents of the files that go into the
training wheel (pyproject.toml, README, src/; caches and build outputs left
out), so the wheel is rebuilt and reinstalled only when they change. Tests and
other files beside the package do not count.

usage: python tree_hash.py PACKAGE_DIR
"""

import hashlib
import os
import sys

INCLUDE = ("pyproject.toml", "setup.cfg", "setup.py", "README.md", "README.rst", "LICENSE", "src")
SKIP_DIRS = {"__pycache__", ".pytest_cache", ".ruff_cache", "build", "dist"}

root = sys.argv[1]
digest = hashlib.sha256()


def add(path):
    digest.update(os.path.relpath(path, root).encode() + b"\0")
    with open(path, "rb") as f:
        digest.update(f.read())
    digest.update(b"\0")


for entry in INCLUDE:
    top = os.path.join(root, entry)
    if os.path.isfile(top):
        add(top)
    for base, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info"))
        for name in sorted(files):
            if not name.endswith(".pyc"):
                add(os.path.join(base, name))
print(digest.hexdigest())
