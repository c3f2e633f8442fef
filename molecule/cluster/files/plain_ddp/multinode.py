"""A plain DDP script like pytorch/examples' multinode tutorial: not part of torchrig.

Its layout is the tutorial's: this entry module beside a helper module (ddp_data.py),
positional arguments, and a snapshot in the working directory (the job's run
directory). train.yml runs it with -e script=<this directory> -e entry=multinode.py
and extra_args. torchrun starts it on every node; it trains a linear model with gloo.
Each node's local rank 0 writes snapshot.pt, as the tutorial does; rank 0 writes
result.json into the working directory, and its arguments with the weights into
TORCHRIG_OUTPUT_DIR/result.pt. train.yml fetches them all to the controller.
"""

import json
import os
import socket
import sys

import torch
import torch.distributed as dist
from ddp_data import make_data
from torch.nn.parallel import DistributedDataParallel as DDP


def main(args: list[str]) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(10, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = make_data()
    for _ in range(50):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    if int(os.environ["LOCAL_RANK"]) == 0:
        torch.save({"MODEL_STATE": model.module.state_dict(), "EPOCHS_RUN": 50}, "snapshot.pt")
    hosts = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    if rank == 0:
        with open("result.json", "w") as f:
            json.dump({"world_size": world, "hosts": hosts, "loss": loss.item()}, f)
        torch.save({"args": args, "weight": model.module.weight.detach()},
                   os.path.join(os.environ["TORCHRIG_OUTPUT_DIR"], "result.pt"))
    print(f"plain_ddp rank {rank} of {world} on {socket.gethostname()}: loss {loss.item():.4f}, "
          f"arguments {args}")
    # Both ranks leave together: a rank that tears gloo down while its peer still
    # talks to it may abort in C++ ("terminate called without an active exception")
    # after its work is done (seen in CI with torch 2.14.1).
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(sys.argv[1:])
