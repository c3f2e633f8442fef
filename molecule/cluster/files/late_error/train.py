"""Rank 0 fails while saving, after rank 1 has finished for good (faults.yml, f-late).

Like a script that saves its model on rank 0 alone at the end: the other node's
workers have exited, so no restart can bring the job back together.
"""

import sys
import time

import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
dist.barrier()
dist.destroy_process_group()
if rank != 0:
    sys.exit(0)
time.sleep(3)
raise RuntimeError("saving the model failed: model.ckpt is not writable")
