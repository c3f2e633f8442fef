"""The helper module beside the entry module, as in pytorch/examples' layout."""

import torch


def make_data(n: int = 256, features: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """A linear problem with a fixed seed: the same data on every rank."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(n, features, generator=g), torch.randn(features, 1, generator=g)
    return x, x @ w
