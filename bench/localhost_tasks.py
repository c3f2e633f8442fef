#!/usr/bin/env python3
"""What the controller venv's zip-import bytecode cache saves a task run on localhost.

Tasks delegated to localhost (the package source's fetch, the results' fetch,
every molecule step on the controller) run their module in a fresh Python of
the controller venv, importing ansible.module_utils from a zip; `make setup`
gives that venv roles/local_cluster/files/torchrig_zip_bytecode.py with its
cache in ~/.cache/torchrig/zip-bytecode. This runs one playbook of --tasks
`ansible.builtin.stat` tasks on localhost, with the cache refused (its
directory opened to others, which the cache does not trust) and in use,
alternating for --rounds rounds, and reads the CPU seconds of each run from
its rusage. Printed: CPU seconds per task, off and on, and their ratio. A
script, not a test: it prints figures.

    .venv/bin/python bench/localhost_tasks.py --rounds 3 --tasks 20
"""

from __future__ import annotations

import argparse
import os
import sys
import sysconfig
import tempfile
from pathlib import Path

from cpu_meter import run_cpu_s

CACHE = Path.home() / ".cache/torchrig/zip-bytecode"  # the Makefile's $(CACHE)/zip-bytecode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=20)
    args = ap.parse_args()
    pth = Path(sysconfig.get_path("purelib")) / "torchrig_zip_bytecode.pth"
    if not pth.is_file():
        print(f"{pth} is missing: run `make setup` first", file=sys.stderr)
        return 2
    CACHE.mkdir(mode=0o700, parents=True, exist_ok=True)
    playbook = "- hosts: localhost\n  gather_facts: false\n  tasks:\n" + "".join(
        "    - ansible.builtin.stat: {path: /tmp}\n" for _ in range(args.tasks))
    spent = {"off": 0.0, "on": 0.0}
    env = {**os.environ, "ANSIBLE_LOCALHOST_WARNING": "false", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false"}
    with tempfile.TemporaryDirectory() as tmp:
        play = Path(tmp) / "tasks.yml"
        play.write_text(playbook)
        try:
            for _ in range(args.rounds):
                for mode, mode_bits in (("off", 0o777), ("on", 0o700)):
                    CACHE.chmod(mode_bits)
                    spent[mode] += run_cpu_s([str(Path(sys.executable).parent / "ansible-playbook"), str(play)],
                                             env=env, cwd=tmp)
        finally:
            CACHE.chmod(0o700)
    n = args.rounds * args.tasks
    off, on = spent["off"] / n, spent["on"] / n
    print(f"ansible-playbook, {args.tasks} stat tasks on localhost, {args.rounds} runs each, CPU s per task "
          "(the playbook's start included):")
    print(f"  cache refused {off:.3f}   cache in use {on:.3f}   on/off {on / off:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
