"""A plain DDP script like the tutorials': not part of torchrig.

torchrun starts it on every node; it trains a linear model on random data with
gloo and rank 0 writes result.json into the working directory (the job's run
directory), which train.yml fetches to the controller.
"""

import json
import os
import socket

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(10, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, w = torch.randn(256, 10), torch.randn(10, 1)
    y = x @ w
    for _ in range(50):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    hosts = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    if rank == 0:
        with open("result.json", "w") as f:
            json.dump({"world_size": world, "hosts": hosts, "loss": loss.item()}, f)
    print(f"plain_ddp rank {rank} of {world} on {socket.gethostname()}: loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
