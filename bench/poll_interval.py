#!/usr/bin/env python3
"""What ansible.cfg's internal_poll_interval costs an ansible-playbook that waits.

ansible-playbook's main loop looks for its workers' results every
internal_poll_interval seconds while a task runs: Ansible's default is 1 ms,
torchrig's ansible.cfg sets 5 ms. Most of a test run's ansible-playbook
processes wait (on a node's task, on a job, on a playbook they started), so
that loop's CPU adds up. This runs a playbook of one task that sleeps --wait
seconds on localhost, and one of --tasks short tasks, with each interval,
alternating for --rounds rounds, and reads the CPU seconds of each run from its
rusage. Printed: CPU seconds per run for each interval, and their ratio. A
script, not a test: it prints figures.

    .venv/bin/python bench/poll_interval.py --rounds 3
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from cpu_meter import run_cpu_s

INTERVALS = ("0.001", "0.005")  # Ansible's default, torchrig's ansible.cfg


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--wait", type=int, default=20)
    ap.add_argument("--tasks", type=int, default=40)
    args = ap.parse_args()
    head = "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
    plays = {
        f"one task sleeping {args.wait} s": head + f"    - ansible.builtin.command: sleep {args.wait}\n",
        f"{args.tasks} stat tasks": head + "    - ansible.builtin.stat: {path: /tmp}\n" * args.tasks,
    }
    env = {**os.environ, "ANSIBLE_LOCALHOST_WARNING": "false", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false"}
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in plays.items():
            play = Path(tmp) / "play.yml"
            play.write_text(text)
            spent = dict.fromkeys(INTERVALS, 0.0)
            for _ in range(args.rounds):
                for interval in INTERVALS:
                    cfg = Path(tmp) / f"ansible-{interval}.cfg"
                    cfg.write_text(f"[defaults]\ninternal_poll_interval = {interval}\n")
                    spent[interval] += run_cpu_s([str(Path(sys.executable).parent / "ansible-playbook"), "-e",
                                                  f"ansible_python_interpreter={sys.executable}", str(play)],
                                                 env={**env, "ANSIBLE_CONFIG": str(cfg)}, cwd=tmp)
            old, new = (spent[i] / args.rounds for i in INTERVALS)
            print(f"ansible-playbook, {name} on localhost, {args.rounds} runs each, CPU s per run:")
            print(f"  every {INTERVALS[0]} s {old:.2f}   every {INTERVALS[1]} s {new:.2f}   ratio {new / old:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
