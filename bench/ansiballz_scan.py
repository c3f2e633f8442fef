#!/usr/bin/env python3
"""What the controller venv's cache of Ansible's import scans saves a playbook run.

Every ansible-playbook run scans each module it sends, and that module's
module_utils, for imports, once per run; `make setup` gives the venv
roles/local_cluster/files/torchrig_ansiballz_scan.py with its cache in
~/.cache/torchrig/ansiballz-scan. This runs one playbook of --modules tasks on
localhost, each with a module of its own (as a role's tasks are), with the
cache refused (its directory opened to others, which the cache does not trust)
and in use, alternating for --rounds rounds, and reads the CPU seconds of each
run from its rusage. Printed: CPU seconds per run, off and on, and their ratio.
A script, not a test: it prints figures.

    .venv/bin/python bench/ansiballz_scan.py --rounds 3
"""

from __future__ import annotations

import argparse
import os
import sys
import sysconfig
import tempfile
from pathlib import Path

from cpu_meter import run_cpu_s

CACHE = Path.home() / ".cache/torchrig/ansiballz-scan"  # the Makefile's $(CACHE)/ansiballz-scan

# One task per module, each harmless on the machine that runs it (check mode, or a scratch directory).
TASKS = [
    "ansible.builtin.stat: {path: /etc/hostname}",
    "ansible.builtin.file: {path: '{{ scratch }}/d', state: directory, mode: '0755'}",
    "ansible.builtin.copy: {dest: '{{ scratch }}/d/a', content: 'x', mode: '0644'}",
    "ansible.builtin.command: {cmd: 'true'}",
    "ansible.builtin.lineinfile: {path: '{{ scratch }}/d/a', line: 'y'}",
    "ansible.builtin.find: {paths: '{{ scratch }}/d'}",
    "ansible.builtin.slurp: {src: /etc/hostname}",
    "ansible.builtin.getent: {database: passwd, key: root}",
    "ansible.builtin.replace: {path: '{{ scratch }}/d/a', regexp: 'y', replace: 'z'}",
    "ansible.builtin.tempfile: {path: '{{ scratch }}'}",
    "ansible.builtin.get_url: {url: 'file:///etc/hostname', dest: '{{ scratch }}/d/h', mode: '0644'}",
    "ansible.builtin.unarchive: {src: /nonexistent.tar, dest: '{{ scratch }}', remote_src: true}",
    "community.general.ini_file: {path: '{{ scratch }}/d/i.ini', section: s, option: o, value: v, mode: '0644'}",
    "ansible.posix.sysctl: {name: kernel.pid_max, value: '4194304', sysctl_set: false, reload: false, "
    "sysctl_file: '{{ scratch }}/d/s.conf'}",
    "ansible.builtin.systemd_service: {name: torchrig-bench-none}",
    "ansible.builtin.apt: {name: bash}",
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modules", type=int, default=len(TASKS), choices=range(1, len(TASKS) + 1))
    args = ap.parse_args()
    pth = Path(sysconfig.get_path("purelib")) / "torchrig_ansiballz_scan.pth"
    if not pth.is_file():
        print(f"{pth} is missing: run `make setup` first", file=sys.stderr)
        return 2
    CACHE.mkdir(mode=0o700, parents=True, exist_ok=True)
    # check mode and ignore_errors: what is measured is Ansible sending each module, not what it does.
    playbook = "- hosts: localhost\n  gather_facts: false\n  check_mode: true\n  tasks:\n" + "".join(
        f"    - {task}\n      ignore_errors: true\n" for task in TASKS[: args.modules])
    spent = {"off": 0.0, "on": 0.0}
    env = {**os.environ, "ANSIBLE_LOCALHOST_WARNING": "false", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false"}
    with tempfile.TemporaryDirectory() as tmp:
        play = Path(tmp) / "modules.yml"
        play.write_text(playbook)
        argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-e", f"scratch={tmp}",
                "-e", f"ansible_python_interpreter={sys.executable}", str(play)]
        try:
            for _ in range(args.rounds):
                for mode, mode_bits in (("off", 0o777), ("on", 0o700)):
                    CACHE.chmod(mode_bits)
                    spent[mode] += run_cpu_s(argv, env=env, cwd=tmp)
        finally:
            CACHE.chmod(0o700)
    off, on = spent["off"] / args.rounds, spent["on"] / args.rounds
    print(f"ansible-playbook, {args.modules} tasks of as many modules on localhost, {args.rounds} runs each, "
          "CPU s per run (the playbook's start included):")
    print(f"  cache refused {off:.2f}   cache in use {on:.2f}   on/off {on / off:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
