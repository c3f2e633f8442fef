"""A job that holds the GPUs train.yml gave it until the scenario lets it end (sharing.yml).

The GPUs are stand-ins (directories where the driver would list them), so it never
imports torch: it writes the CUDA_VISIBLE_DEVICES its node gave it and when it started
to gpus.txt in its working directory (the job's run directory), then waits for a file
named `release` there, which the scenario writes as root.
"""

import os
import sys
import time
from pathlib import Path

# A release left by an earlier run of this job name would end this one at once.
Path("release").unlink(missing_ok=True)
# One process per GPU runs this in the same directory: each writes its own temporary
# file (a shared name raced: one process's rename took the other's file away).
tmp = Path(f"gpus.txt.{os.getpid()}.tmp")
tmp.write_text(f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')} {time.time():.3f}\n")
tmp.replace("gpus.txt")

# Never a unit that outlives a failed scenario by more than this.
deadline = time.monotonic() + 900
while not Path("release").exists():
    if time.monotonic() > deadline:
        sys.exit("gpu_hold: not released within 900 s")
    time.sleep(0.2)
