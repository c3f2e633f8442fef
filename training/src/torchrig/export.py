"""The trained model as a file: weights in safetensors, and what rebuilds the model beside it.

    model.safetensors   the weights only (no pickle: loading it runs no code)
    model.json          model name, classes, input shape, normalisation, held-out result

Rebuild and use it:

    from torchrig.export import load_model, normalise
    model, meta = load_model("runs/mnist5k-cnn")        # eval mode, on the CPU
    classes = model(normalise(images, meta)).argmax(1)  # images: (N, C, H, W), raw pixels

The metadata is also kept in the safetensors header (key "torchrig"), so the weights file
alone is enough when model.json is lost.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from .models import build_model

WEIGHTS_FILE = "model.safetensors"
META_FILE = "model.json"
FORMAT = "torchrig-model/1"


class ModelFileError(Exception):
    """A run directory without a usable exported model; the message says what is wrong."""


def _atomic_write(path: Path, write) -> None:  # type: ignore[no-untyped-def]
    # A reader (the fetch, torchrig-eval) must never see half a file under the final name.
    tmp = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def save_model(run_dir: Path, model: torch.nn.Module, meta: dict[str, Any]) -> Path:
    """Write model.safetensors and model.json into `run_dir`; returns the weights' path."""
    # safetensors takes contiguous tensors that share no memory: channels-last weights
    # and tied parameters would be refused, so each tensor is copied to a plain CPU one.
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in model.state_dict().items()}
    meta = {"format": FORMAT, **meta}
    weights = run_dir / WEIGHTS_FILE
    _atomic_write(weights, lambda p: save_file(tensors, str(p), metadata={"torchrig":
                                                                           json.dumps(meta)}))
    _atomic_write(run_dir / META_FILE,
                  lambda p: p.write_text(json.dumps(meta, indent=2) + "\n"))
    return weights


def remove_model(run_dir: Path) -> None:
    """An exported model left by an earlier attempt must not read as this run's result."""
    for name in (WEIGHTS_FILE, META_FILE):
        (run_dir / name).unlink(missing_ok=True)


def read_meta(run_dir: Path) -> dict[str, Any]:
    """model.json of a run directory (or the copy in the weights' header), checked."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ModelFileError(f"{run_dir}: no such directory (a job's results are in "
                             "runs/<job>/, where train.yml fetched them)")
    weights = run_dir / WEIGHTS_FILE
    if not weights.is_file():
        raise ModelFileError(
            f"{run_dir} has no {WEIGHTS_FILE}: a job of the training package writes it when it "
            "finishes (a stopped or failed job, or a job of your own script, has none)")
    meta_path = run_dir / META_FILE
    try:
        if meta_path.is_file():
            meta = json.loads(meta_path.read_text())
        else:
            with safe_open(str(weights), framework="pt") as f:
                meta = json.loads((f.metadata() or {})["torchrig"])
    except (OSError, ValueError, KeyError) as e:
        raise ModelFileError(f"{run_dir}: cannot read the model's metadata ({META_FILE}, or the "
                             f"header of {WEIGHTS_FILE}): {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ModelFileError(f"{meta_path}: not a torchrig model description (format "
                             f"{meta.get('format') if isinstance(meta, dict) else None!r}, "
                             f"expected {FORMAT!r})")
    missing = [k for k in ("model", "dataset", "num_classes", "input_shape", "mean", "std")
               if k not in meta]
    if missing:
        raise ModelFileError(f"{meta_path}: missing {', '.join(missing)}")
    return meta


def load_model(run_dir: str | Path, device: str | torch.device = "cpu"
               ) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The exported model of `run_dir` in eval mode on `device`, and its metadata."""
    run_dir = Path(run_dir)
    meta = read_meta(run_dir)
    channels, size, _ = meta["input_shape"]
    model = build_model(meta["model"], channels, meta["num_classes"], size)
    try:
        state = load_file(str(run_dir / WEIGHTS_FILE), device="cpu")
        model.load_state_dict(state)
    except Exception as e:  # a truncated file, or weights of another model
        raise ModelFileError(f"{run_dir / WEIGHTS_FILE}: does not load into model "
                             f"{meta['model']!r}: {e}") from None
    return model.to(device).eval(), meta


def normalise(images: torch.Tensor, meta: dict[str, Any]) -> torch.Tensor:
    """Raw images (N, C, H, W) in the dataset's pixel scale, as the model was trained on."""
    mean = torch.tensor(meta["mean"], dtype=torch.float32, device=images.device)
    std = torch.tensor(meta["std"], dtype=torch.float32, device=images.device)
    return (images.float() - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1)
