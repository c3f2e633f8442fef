"""Write a learnable ImageFolder data set of generated images (tests, benchmarks, demos).

    python -m torchrig.make_images DIR --classes 4 --train 200 --val 50 --size 48 64

Each class has a colour and a stripe direction of its own; every image adds noise and has a
random size between the two --size values (not square), so a model must learn the class
through the noise and the trainer must resize. Images are binary PPM (uncompressed,
fast to write, read by Pillow). The same arguments write the same bytes on every node.
Prints the file count and the bytes written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np


def class_image(rng: np.random.Generator, label: int, classes: int, height: int,
                width: int) -> np.ndarray:
    """(height, width, 3) uint8: the class's colour and stripes, under heavy noise."""
    hue = label / classes
    colour = 127 + 40 * np.cos(2 * np.pi * (hue + np.array([0, 1 / 3, 2 / 3], np.float32)))
    # Stripes 4 px wide, across the image for even classes, down it for odd ones.
    stripes = np.where(np.arange(width if label % 2 == 0 else height) % 8 < 4, 25, -25)
    stripes = stripes[None, :, None] if label % 2 == 0 else stripes[:, None, None]
    image = rng.standard_normal((height, width, 3), dtype=np.float32)  # float32: 2x faster
    image *= 70
    image += colour.astype(np.float32)
    image += stripes
    return np.clip(image, 0, 255, out=image).astype(np.uint8)


def write_ppm(path: Path, image: np.ndarray) -> int:
    data = b"P6\n%d %d\n255\n" % (image.shape[1], image.shape[0]) + image.tobytes()
    path.write_bytes(data)
    return len(data)


def generate(root: Path, classes: int, train: int, val: int, size: tuple[int, int],
             seed: int = 0) -> tuple[int, int]:
    """root/train/<class>/*.ppm (`train` per class) and root/val/... (`val` per class);
    returns (files, bytes)."""
    rng = np.random.default_rng(seed)
    files = total = 0
    for split, per_class in (("train", train), ("val", val)):
        for label in range(classes):
            folder = root / split / f"class{label:02d}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                h, w = (int(v) for v in rng.integers(size[0], size[1] + 1, 2))
                total += write_ppm(folder / f"{i:06d}.ppm",
                                   class_image(rng, label, classes, h, w))
                files += 1
    return files, total


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m torchrig.make_images", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("root", type=Path, help="the data set's directory (train/ and val/ go in it)")
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--train", type=int, default=200, help="training images per class")
    p.add_argument("--val", type=int, default=50, help="held-out images per class")
    p.add_argument("--size", type=int, nargs=2, default=(48, 64), metavar=("MIN", "MAX"),
                   help="each side of an image, in pixels, drawn between MIN and MAX")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if not (2 <= args.classes <= 100 and args.train >= 1 and args.val >= 1
            and 8 <= args.size[0] <= args.size[1]):
        p.error("need 2 to 100 classes, at least 1 image per class and split, "
                "and 8 <= MIN <= MAX")
    files, total = generate(args.root, args.classes, args.train, args.val, tuple(args.size),
                            args.seed)
    print(f"{files} files, {total} bytes in {args.root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
