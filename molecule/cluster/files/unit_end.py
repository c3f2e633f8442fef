#!/usr/bin/env python3
"""How a job's unit ended on a node, as one JSON object on stdout.

    unit_end.py NODE JOB

Its state, result, main status, service restarts, whether it is still enabled, how many
workers started (their "torchrig: rank" lines in the journal), and the nodes-missing
file if torchrig.launch wrote one (null otherwise). NODE is the node's container; the
file's name comes from the job contract, so this script has no copy of it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "training" / "src"))
from torchrig.contract import FILES  # noqa: E402  (the checkout's package, not the venv's)

RUNS_DIR = "/var/lib/torchrig/runs"


def on_node(node: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", "exec", node, *argv], capture_output=True, text=True, check=False)


def main() -> int:
    node, job = sys.argv[1], sys.argv[2]
    unit = f"torchrig-job@{job}.service"
    props = on_node(node, "systemctl", "show", unit, "--property=ActiveState,Result,ExecMainStatus,NRestarts")
    shown = dict(line.split("=", 1) for line in props.stdout.splitlines() if "=" in line)
    journal = on_node(node, "journalctl", f"--unit={unit}", "--output=cat", "--no-pager").stdout
    ended = on_node(node, "cat", f"{RUNS_DIR}/{job}/{FILES['ended']}")
    print(json.dumps({
        "state": shown.get("ActiveState", ""),
        "result": shown.get("Result", ""),
        "main_status": int(shown.get("ExecMainStatus") or 0),
        "service_restarts": int(shown.get("NRestarts") or 0),
        "enabled": on_node(node, "systemctl", "is-enabled", unit).stdout.strip(),
        "workers": sum(line.startswith("torchrig: rank") for line in journal.splitlines()),
        "ended": json.loads(ended.stdout) if ended.returncode == 0 and ended.stdout.strip() else None,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
