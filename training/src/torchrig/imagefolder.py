"""--dataset imagefolder: images streamed from disk, never loaded whole.

The layout is torchvision's ImageFolder, under --data-dir:

    DATA_DIR/train/<class>/*.png|jpg|bmp|ppm|...    the training images, a folder per class
    DATA_DIR/val/<class>/...                        the held-out images, the same classes

The dataset objects hold file paths only. Worker processes (DataLoader, --workers) read,
resize and centre-crop each image to --image-size square pixels as uint8; the training
process turns a batch into normalised float32 on its device. The order is the trainer's
DistributedSampler order, so a resumed run skips the batches already done without
reading them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from .data import UsageError, import_torchvision

# The images whose per-channel mean and std normalise the data: a fixed, evenly spread
# subset of the training set (reading the whole set would cost a pass over the disk).
STATS_SAMPLES = 512


def _class_dirs(split: Path, extensions: tuple[str, ...]) -> list[str]:
    """The class folders of `split`; errors name a missing split or an empty class."""
    if not split.is_dir():
        raise UsageError(f"--dataset imagefolder: {split} is missing; --data-dir must hold "
                         "train/ and val/, each with a folder of images per class")
    classes = sorted(d.name for d in split.iterdir() if d.is_dir())
    if not classes:
        raise UsageError(f"--dataset imagefolder: {split} has no class folders "
                         "(expected train/<class>/<image> and val/<class>/<image>)")
    for c in classes:
        if not any(f.is_file() and f.name.lower().endswith(extensions)
                   for f in (split / c).rglob("*")):
            raise UsageError(f"--dataset imagefolder: class folder {split / c} has no images "
                             f"(looked for {', '.join(extensions)})")
    return classes


class ImageFolderData:
    """The train and val splits of an ImageFolder directory, as the Trainer uses a Data."""

    def __init__(self, root: str, image_size: int, workers: int,
                 device: torch.device | None = None) -> None:
        tv = import_torchvision("--dataset imagefolder")
        from torchvision.datasets.folder import IMG_EXTENSIONS
        from torchvision.transforms import v2

        base = Path(root)
        train_classes = _class_dirs(base / "train", IMG_EXTENSIONS)
        val_classes = _class_dirs(base / "val", IMG_EXTENSIONS)
        if train_classes != val_classes:
            only_train = sorted(set(train_classes) - set(val_classes))
            only_val = sorted(set(val_classes) - set(train_classes))
            raise UsageError(
                f"--dataset imagefolder: {base}/train and {base}/val must have the same class "
                f"folders; only in train: {', '.join(only_train) or 'none'}; only in val: "
                f"{', '.join(only_val) or 'none'}")
        # ImageFolder's loader opens every file as RGB (grey, palette and alpha converted),
        # and every image leaves the transform the same size: any files stack into a batch.
        transform = v2.Compose([v2.PILToTensor(), v2.Resize(image_size, antialias=True),
                                v2.CenterCrop(image_size)])
        self.train = tv.datasets.ImageFolder(str(base / "train"), transform=transform)
        self.test = tv.datasets.ImageFolder(str(base / "val"), transform=transform)
        self.classes: list[str] = list(self.train.classes)
        self.num_classes = len(self.classes)
        self.in_channels, self.image_size = 3, image_size
        self.workers = workers
        self.train_size, self.test_size = len(self.train), len(self.test)
        picks = torch.linspace(0, self.train_size - 1, min(STATS_SAMPLES, self.train_size))
        sample = torch.stack([self.train[int(i)][0] for i in picks]).float()
        self.mean = sample.mean(dim=(0, 2, 3)).tolist()
        self.std = sample.std(dim=(0, 2, 3)).clamp_min(1e-6).tolist()
        self.to(device or torch.device("cpu"))

    def to(self, device: torch.device) -> ImageFolderData:
        """Batches come out on `device` (the files stay where they are)."""
        self.device = device
        self._mean = torch.tensor(self.mean, device=device).view(1, -1, 1, 1)
        self._std = torch.tensor(self.std, device=device).view(1, -1, 1, 1)
        return self

    @property
    def input_shape(self) -> list[int]:
        return [self.in_channels, self.image_size, self.image_size]

    def _loader(self, dataset, batches: list[list[int]]) -> Iterator[tuple[torch.Tensor,
                                                                           torch.Tensor]]:
        loader = DataLoader(dataset, batch_sampler=batches, num_workers=self.workers,
                            pin_memory=self.device.type == "cuda")
        for x, y in loader:
            x = x.to(self.device, non_blocking=True).float()
            yield (x - self._mean) / self._std, y.to(self.device, non_blocking=True)

    def train_batches(self, order: list[int],
                      per_step: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The training samples of `order`, `per_step` at a time (len(order) is a multiple)."""
        return self._loader(self.train, [order[i:i + per_step]
                                         for i in range(0, len(order), per_step)])

    def test_batches(self, rank: int, world_size: int,
                     batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's share of the held-out set: every world_size-th image."""
        idx = list(range(rank, self.test_size, world_size))
        return self._loader(self.test, [idx[j:j + batch_size]
                                        for j in range(0, len(idx), batch_size)])
