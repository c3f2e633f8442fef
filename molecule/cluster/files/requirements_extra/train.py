"""A DDP script with a requirement of its own (requirements.txt: tomli-w).

Every rank imports it and trains a linear model with gloo; each node's local
rank 0 records, in TORCHRIG_OUTPUT_DIR/venv.json, which python ran it, where
tomli_w and torch came from and their versions (molecule/cluster/verify_job_venv.yml
reads them), and rank 0 writes result.toml with tomli_w itself.
"""

import json
import os
import socket
import sys

import tomli_w
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(64, 4), torch.randn(64, 1)
    for _ in range(20):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    import importlib.metadata

    seen = {"host": socket.gethostname(), "rank": rank, "world_size": world, "executable": sys.executable,
            "prefix": sys.prefix, "tomli_w": importlib.metadata.version("tomli-w"), "tomli_w_file": tomli_w.__file__,
            "torch": torch.__version__, "torch_file": torch.__file__}
    hosts = [None] * world
    dist.all_gather_object(hosts, seen)
    out = os.environ["TORCHRIG_OUTPUT_DIR"]
    if int(os.environ["LOCAL_RANK"]) == 0:
        with open(os.path.join(out, "venv.json"), "w") as f:
            json.dump(seen, f)
    if rank == 0:
        with open(os.path.join(out, "result.toml"), "wb") as f:
            tomli_w.dump({"world_size": world, "loss": loss.item(), "tomli_w": seen["tomli_w"],
                          "hosts": sorted(h["host"] for h in hosts)}, f)
    print(f"requirements_extra rank {rank} of {world} on {seen['host']}: tomli_w {seen['tomli_w']} "
          f"from {tomli_w.__file__}, torch {torch.__version__}, python {sys.executable}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
