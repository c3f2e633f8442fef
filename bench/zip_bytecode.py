#!/usr/bin/env python3
"""What the node image's zip-import bytecode cache saves an Ansible task on a node.

Each Ansible task runs its module in a fresh Python on the node, importing
ansible.module_utils from a zip in a new temporary directory
(roles/local_cluster/files/torchrig_zip_bytecode.py keeps root's compiled code
of such imports). This starts one container of the node image, copies in a zip
of the controller's own ansible package as a task's payload carries it, and
times `import ansible.module_utils.basic` from a fresh copy of it, --imports
times with the cache refused (its directory opened to others, which the cache
does not trust) and as many with it in use, alternating for --rounds rounds.
CPU seconds are read from the container's cgroup. Printed: CPU seconds per
import, off and on, and their ratio. A script, not a test: it prints figures.

    .venv/bin/python bench/zip_bytecode.py --rounds 3 --imports 20
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import ansible

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_meter import cgroup_cpu_s, cgroup_usage_file  # noqa: E402

NAME = "torchrig-bench-zip-bytecode"
IMAGE = "localhost/torchrig-node:latest"
CACHE = "/var/cache/torchrig-zip-bytecode"
IMPORTS = """
for i in $(seq {n}); do
  d=$(mktemp -d) && cp /tmp/payload.zip "$d/" &&
  python3 -c "import sys; sys.path.insert(0, '$d/payload.zip'); import ansible.module_utils.basic" &&
  rm -rf "$d" || exit 1
done
"""


def payload(dest: Path) -> None:
    """The part of the ansible package a module's payload carries for module_utils.basic."""
    root = Path(ansible.__file__).parent
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as z:
        for sub in ("__init__.py", "release.py", "_vendor", "module_utils"):
            paths = [root / sub] if (root / sub).is_file() else sorted((root / sub).rglob("*.py"))
            for path in paths:
                z.write(path, str(path.relative_to(root.parent)))


def podman(*args: str) -> str:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=True).stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--imports", type=int, default=20)
    args = ap.parse_args()
    subprocess.run(["podman", "rm", "-f", "-t", "0", NAME], capture_output=True, check=False)
    podman("run", "-d", "--name", NAME, IMAGE, "sleep", "infinity")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            payload(Path(tmp) / "payload.zip")
            podman("cp", str(Path(tmp) / "payload.zip"), f"{NAME}:/tmp/payload.zip")
        podman("exec", NAME, "mkdir", "-p", CACHE)
        usage = cgroup_usage_file(NAME)
        spent = {"off": 0.0, "on": 0.0}
        for _ in range(args.rounds):
            for mode, chmod in (("off", "0777"), ("on", "0700")):
                podman("exec", NAME, "chmod", chmod, CACHE)
                before = cgroup_cpu_s(usage)
                podman("exec", NAME, "sh", "-c", IMPORTS.format(n=args.imports))
                spent[mode] += cgroup_cpu_s(usage) - before
        n = args.rounds * args.imports
        off, on = spent["off"] / n, spent["on"] / n
        print(f"import ansible.module_utils.basic from a task's zip, {n} imports each, CPU s per import:")
        print(f"  cache off {off:.3f}, on {on:.3f}; on/off {on / off:.2f}")
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "0", NAME], capture_output=True, check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
