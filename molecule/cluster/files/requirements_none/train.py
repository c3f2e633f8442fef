"""A script without requirements.txt, run after a job that had one: it runs with
the stack venv's python, sees the stack's torch and not the other job's packages.
Each node's local rank 0 writes TORCHRIG_OUTPUT_DIR/venv.json."""

import importlib.util
import json
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.ones(1)
dist.all_reduce(total)
if int(os.environ["LOCAL_RANK"]) == 0:
    with open(os.path.join(os.environ["TORCHRIG_OUTPUT_DIR"], "venv.json"), "w") as f:
        json.dump({"executable": sys.executable, "prefix": sys.prefix, "torch": torch.__version__,
                   "world_size": int(total.item()), "tomli_w": importlib.util.find_spec("tomli_w") is not None}, f)
dist.destroy_process_group()
