#!/usr/bin/env python3
"""Times of a node fault, read from the nodes' job journals (journalctl -o short-iso-precise).

    fault_times.py FAULT.json NODE1.log [NODE2.log]

Prints one JSON object, seconds after the kill (fault.json's killed_at):
  detected_s  node1's first sign of the loss: its worker failed (a reset or a closed
              connection, or the process-group timeout) or torchrun saw the node
              waiting to rejoin
  resumed_s   the first "resumed from step" line after the kill, on any node
  ended_s     the end: the trainer's "done:" line, or torchrig.launch's "did not join"
  step_at_kill  the newest training step node1 logged before the kill
"""

from __future__ import annotations

import json
import re
import sys
from datetime import datetime
from pathlib import Path

DETECTED = re.compile(r"failed \(exitcode|Timed out waiting|Connection reset|Connection closed by peer"
                      r"|Detected \d+ new nodes")
RESUMED = re.compile(r"resumed from step (\d+)")
ENDED = re.compile(r"INFO done: held-out|did not join within")
STEP = re.compile(r"INFO train step (\d+) ")


def events(path: Path) -> list[tuple[float, str]]:
    """(unix time, message) for every journal line with an ISO timestamp."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        stamp, _, rest = line.partition(" ")
        try:
            out.append((datetime.fromisoformat(stamp).timestamp(), rest))
        except ValueError:
            continue
    return out


def first_after(lines: list[tuple[float, str]], pattern: re.Pattern, t0: float) -> float | None:
    return next((t - t0 for t, msg in lines if t >= t0 and pattern.search(msg)), None)


def main() -> int:
    fault = json.loads(Path(sys.argv[1]).read_text())
    t0 = float(fault["killed_at"])
    node1 = events(Path(sys.argv[2]))
    every = node1 + [e for p in sys.argv[3:] if Path(p).exists() for e in events(Path(p))]
    every.sort()
    steps = [int(m.group(1)) for t, msg in node1 if t < t0 and (m := STEP.search(msg))]
    resumed = next((int(m.group(1)) for t, msg in every if t >= t0 and (m := RESUMED.search(msg))), None)
    times = {
        "detected_s": first_after(node1, DETECTED, t0),
        "resumed_s": first_after(every, RESUMED, t0),
        "resumed_from_step": resumed,
        "ended_s": first_after(every, ENDED, t0),
        "step_at_kill": max(steps) if steps else None,
    }
    print(json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in times.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
