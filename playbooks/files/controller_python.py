#!/usr/bin/env python3
"""Stops `make setup` early, with a clear message, on a controller whose python3
cannot run the ansible-core that requirements.txt pins (pip would only say
"No matching distribution found for ansible-core==...").

    controller_python.py requirements.txt     # exit 1 and the message when too old or too new

Only the standard library, and syntax old Pythons still parse: it runs
before the venv exists, under whatever python3 the machine has.
"""

import re
import sys

# Controller Pythons per ansible-core release: ansible-core's support matrix,
# https://docs.ansible.com/ansible/latest/reference_appendices/release_and_maintenance.html#ansible-core-support-matrix
# (and each release's Requires-Python on PyPI).
CONTROLLER_PYTHON = {
    (2, 17): ((3, 10), (3, 12)),
    (2, 18): ((3, 11), (3, 13)),
    (2, 19): ((3, 11), (3, 13)),
    (2, 20): ((3, 12), (3, 14)),
}


def pinned_core(requirements_text):
    m = re.search(r"^ansible-core==(\d+)\.(\d+)(\.\S+)?\s*$", requirements_text, re.M)
    if not m:
        raise ValueError("requirements.txt pins no ansible-core (expected a line like ansible-core==2.19.14)")
    return (int(m.group(1)), int(m.group(2))), m.group(0).strip()


def problem(requirements_text, version, executable):
    """None when this Python can run the pinned ansible-core, else the message."""
    core, pin = pinned_core(requirements_text)
    if core not in CONTROLLER_PYTHON:
        raise ValueError(
            "{} is not in controller_python.py's table (known: {}); add its controller Pythons from ansible-core's "
            "support matrix".format(pin, ", ".join("{}.{}".format(*k) for k in sorted(CONTROLLER_PYTHON)))
        )
    low, high = CONTROLLER_PYTHON[core]
    if low <= tuple(version[:2]) <= high:
        return None
    return (
        "torchrig's controller runs {} (requirements.txt), which needs Python {}.{} to {}.{}; this machine's "
        "python3 is Python {} ({}). Needs: a Python {}.{}-{}.{} as python3 (Debian 12 has 3.11, Ubuntu 24.04 "
        "3.12; Ubuntu 22.04's 3.10 is too old), then make setup again."
    ).format(pin, low[0], low[1], high[0], high[1], ".".join(str(p) for p in version[:3]), executable,
             low[0], low[1], high[0], high[1])


def main(argv):
    if len(argv) != 2:
        sys.stderr.write("usage: controller_python.py requirements.txt\n")
        return 2
    with open(argv[1]) as f:
        text = f.read()
    try:
        msg = problem(text, sys.version_info, sys.executable)
    except ValueError as e:
        msg = str(e)
    if msg:
        sys.stderr.write(msg + "\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
