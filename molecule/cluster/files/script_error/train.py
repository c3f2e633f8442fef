"""A script with a bug: it fails the same way on every try (faults.yml, f-raise)."""

import torch.distributed as dist


def load(path: str) -> None:
    raise ValueError(f"no column 'label' in {path}")


dist.init_process_group("gloo")
load("data.csv")
