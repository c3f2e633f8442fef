"""A stand-in for a GPU job (issue 32; molecule/cluster/gpus.yml): each worker says which
GPUs it was given, then holds them until the test releases the job (a file named release
in its run directory, the working directory) or ten minutes pass. It never touches a GPU:
the nodes' GPUs are stand-ins (torchrun_gpus_dir)."""

import os
import time
from pathlib import Path

print(f"gpu_hold rank {os.environ.get('RANK')} of {os.environ.get('WORLD_SIZE')}: "
      f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')} "
      f"local_world_size={os.environ.get('LOCAL_WORLD_SIZE')}", flush=True)
deadline = time.monotonic() + 600
while not Path("release").exists() and time.monotonic() < deadline:
    time.sleep(0.5)
