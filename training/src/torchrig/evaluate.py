"""torchrig-eval: the held-out accuracy and loss of a job's exported model, on this machine.

    torchrig-eval runs/mnist5k-cnn              # the CPU, or the first GPU if there is one
    torchrig-eval runs/mnist5k-cnn --device cpu

It reads model.safetensors and model.json from the run directory train.yml fetched,
loads the job's dataset the way the trainer does (same held-out split, same
normalisation) and evaluates with the trainer's own function, so the result is the one in
the run's summary (contract.FILES['summary']); no node is involved. Exit status: 0 done,
2 a missing or unusable run directory, dataset or device.
"""

from __future__ import annotations

import argparse
import json
import math
import socket
import sys
from functools import partial
from pathlib import Path

import torch

from .contract import FILES
from .data import UsageError, load_dataset
from .dist import DistEnv, usable_cores
from .export import ModelFileError, load_model


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {name}: no CUDA device is usable here (use --device cpu)")
    return device


def run(run_dir: Path, device: torch.device, data_dir: str, batch_size: int) -> dict:
    """Evaluate the run's exported model; returns what is printed."""
    from .train import evaluate  # the trainer's own evaluation: the same sums, the same result

    model, meta = load_model(run_dir, device)
    data = load_dataset(meta["dataset"], data_dir, download=False,
                        synthetic_shape=meta.get("synthetic_shape", "1x28x28"),
                        synthetic_samples=meta.get("synthetic_samples", 4096),
                        image_size=meta["input_shape"][-1], workers=0)
    if data.input_shape != list(meta["input_shape"]):
        raise ModelFileError(f"{run_dir}: the model takes {meta['input_shape']} images, dataset "
                             f"{meta['dataset']} here has {data.input_shape}")
    if not all(math.isclose(a, b, rel_tol=1e-4) for a, b in zip(
            data.mean + data.std, meta["mean"] + meta["std"], strict=True)):
        print(f"torchrig-eval: warning: dataset {meta['dataset']} here is not the one the model "
              "was trained on (its normalisation differs); the figures are not comparable",
              file=sys.stderr)
    data = data.to(device)
    # On a GPU, the trainer's autocast precision; the CPU evaluates in fp32 as the trainer
    # does there. A bf16-trained model evaluated on the CPU may differ in the 4th digit.
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(
        meta.get("precision", "fp32")) if device.type == "cuda" else None
    autocast = partial(torch.autocast, device.type, dtype=amp_dtype, enabled=amp_dtype is not None)
    env = DistEnv(0, 0, 1, 1, device, None, torch.get_num_threads(), socket.gethostname())
    loss, accuracy = evaluate(model, data, env, batch_size, autocast, channels_last=False)
    out = {"accuracy": accuracy, "loss": loss, "samples": data.test_size,
           "dataset": meta["dataset"], "model": meta["model"], "device": str(device)}
    summary = run_dir / FILES["summary"]
    if summary.is_file():
        try:
            trained = json.loads(summary.read_text())
            out["summary_accuracy"], out["summary_loss"] = trained["accuracy"], trained["loss"]
        except (ValueError, KeyError):
            pass
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="torchrig-eval",
        description="Held-out accuracy and loss of a job's exported model "
        "(runs/<job>/model.safetensors and model.json), on this machine.")
    p.add_argument("run_dir", type=Path, help="the job's results directory, e.g. runs/mnist5k-cnn")
    p.add_argument("--device", default="auto",
                   help="cpu, cuda, cuda:N, or auto (the first GPU if there is one)")
    p.add_argument("--data-dir", default="data",
                   help="torchvision datasets' directory (mnist, fashion-mnist, cifar10), or "
                   "the imagefolder directory (its val/ is evaluated)")
    p.add_argument("--batch-size", type=int, default=500, help="images per evaluation batch")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    args = p.parse_args(argv)
    torch.set_num_threads(usable_cores())
    try:
        out = run(args.run_dir, pick_device(args.device), args.data_dir, max(1, args.batch_size))
    except (ModelFileError, UsageError) as e:
        print(f"torchrig-eval: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"accuracy: {out['accuracy']:.4f} loss: {out['loss']:.4f} (held-out, {out['samples']} "
          f"images of {out['dataset']}, model {out['model']}, on {out['device']})")
    if "summary_accuracy" in out:
        print(f"{FILES['summary']}: accuracy {out['summary_accuracy']:.4f} loss "
              f"{out['summary_loss']:.4f} (at the end of training)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
