"""--dataset imagefolder: a generated ImageFolder set streamed from disk through DataLoader
workers, trained by 2 processes over torchrun; an exact resume; the layout errors; and
that the dataset holds file paths, not the images."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from launch import start, torchrun
from torchrig import worker
from torchrig.config import Config
from torchrig.contract import FILES
from torchrig.data import UsageError
from torchrig.dist import DistEnv
from torchrig.evaluate import run as evaluate_run
from torchrig.imagefolder import ImageFolderData
from torchrig.make_images import generate
from torchrig.train import Trainer

# 4 classes x (150 train + 40 val) images of 24-40 px: 1.7 MB, trained at 16 px.
CLASSES, TRAIN, VAL, SIZE = 4, 150, 40, (24, 40)
FLAGS = {"dataset": "imagefolder", "image-size": 16, "workers": 1, "epochs": 3,
         "batch-size": 16, "eval-batch-size": 64, "warmup-steps": 5, "checkpoint-every": 10,
         "log-every": 10, "seed": 0, "threads": 1}


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("imagefolder")
    generate(root, CLASSES, TRAIN, VAL, SIZE)
    return root


@pytest.fixture
def own_process_state(monkeypatch):
    """The Trainer sets its own SIGTERM handler; the test process gets its own back."""
    monkeypatch.delenv(worker.STOP_REQUESTED_ENV, raising=False)
    previous, threads = signal.getsignal(signal.SIGTERM), torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    signal.signal(signal.SIGTERM, previous)
    torch.set_num_threads(threads)


def flags(data_dir: Path, **overrides) -> list[str]:
    settings = {**FLAGS, "data-dir": str(data_dir),
                **{k.replace("_", "-"): v for k, v in overrides.items()}}
    return [a for k, v in settings.items() for a in (f"--{k}", str(v))]


def test_two_processes_learn_a_streamed_imagefolder(images: Path, tmp_path: Path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    launch = start(torchrun("--standalone", "--nproc-per-node=2", "-m", "torchrig.train",
                            *flags(images), "--run-dir", str(run_dir)), tmp_path / "run.log")
    assert launch.wait() == 0, launch.output()[-4000:]
    summary = json.loads((run_dir / FILES["summary"]).read_text())
    assert summary["world_size"] == 2 and summary["dataset"] == "imagefolder"
    # Chance is 0.25; the classes differ only in a faint colour and stripes under noise.
    assert summary["accuracy"] >= 0.8, summary
    meta = json.loads((run_dir / "model.json").read_text())
    assert meta["classes"] == [f"class{c:02d}" for c in range(CLASSES)]
    assert meta["input_shape"] == [3, 16, 16] and meta["held_out_samples"] == CLASSES * VAL
    # torchrig-eval reads val/ the trainer's way and gets the run's held-out result.
    out = evaluate_run(run_dir, torch.device("cpu"), str(images), 64)
    assert out["accuracy"] == pytest.approx(summary["accuracy"], abs=0.002)
    assert out["loss"] == pytest.approx(summary["loss"], rel=0.01)


def single_trainer(run_dir: Path, data_dir: Path, **settings) -> Trainer:
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = {k.replace("-", "_"): v for k, v in FLAGS.items()}
    cfg.update(epochs=2, data_dir=str(data_dir), run_dir=str(run_dir), **settings)
    return Trainer(Config(**cfg), DistEnv(0, 0, 1, 1, torch.device("cpu"), None, 1, "host"))


def eval_records(run_dir: Path) -> list[dict]:
    return [r for r in map(json.loads, (run_dir / FILES["metrics"]).read_text().splitlines())
            if r["split"] == "eval"]


def test_stopped_mid_epoch_resumes_exactly(images: Path, tmp_path: Path, own_process_state):
    """Stopped at step 50 (mid-epoch 2), then resumed: the same held-out results as the
    uninterrupted run, so set_epoch and the skipped batches give the same data order."""
    whole = single_trainer(tmp_path / "whole", images)
    whole.train()
    first = single_trainer(tmp_path / "cut", images, max_steps=50)
    first.train()
    assert first.progress.step == 50 and first.progress.epoch == 1
    again = single_trainer(tmp_path / "cut", images)
    assert again.resumed_from == 50
    again.train()
    assert eval_records(tmp_path / "cut")[-1] == eval_records(tmp_path / "whole")[-1]


def test_the_dataset_holds_paths_not_images(images: Path):
    """A load-whole implementation would keep the decoded images (or the files' bytes)."""
    files = list(images.rglob("*.ppm"))
    data_bytes = sum(p.stat().st_size for p in files)
    data = ImageFolderData(str(images), 16, workers=0)
    assert data.train_size + data.test_size == len(files)

    def array_bytes(obj, depth: int = 0) -> int:
        if isinstance(obj, torch.Tensor):
            return obj.nbytes
        if isinstance(obj, np.ndarray | bytes | bytearray):
            return len(obj) if isinstance(obj, bytes | bytearray) else obj.nbytes
        if depth > 3:
            return 0
        if isinstance(obj, dict):
            return sum(array_bytes(v, depth + 1) for v in obj.values())
        if isinstance(obj, list | tuple):
            return sum(array_bytes(v, depth + 1) for v in obj)
        if hasattr(obj, "__dict__"):
            return array_bytes(vars(obj), depth + 1)
        return 0

    assert array_bytes(data) < data_bytes / 100
    assert {Path(p) for p, _ in data.train.samples + data.test.samples} == set(files)


def layout(root: Path, train: dict[str, int], val: dict[str, int]) -> Path:
    for split, classes in (("train", train), ("val", val)):
        for name, count in classes.items():
            (root / split / name).mkdir(parents=True)
            for i in range(count):
                (root / split / name / f"{i}.ppm").write_bytes(b"P6\n8 8\n255\n" + bytes(192))
    return root


@pytest.mark.parametrize(("train", "val", "says"), [
    ({"a": 1, "b": 1}, None, "val is missing; --data-dir must hold train/ and val/"),
    ({"a": 1, "b": 0}, {"a": 1, "b": 1}, "class folder {root}/train/b has no images"),
    ({"a": 1, "b": 1}, {"a": 1, "c": 1},
     "{root}/train and {root}/val must have the same class folders; only in train: b; "
     "only in val: c"),
])
def test_a_bad_layout_is_named(tmp_path: Path, train, val, says):
    root = layout(tmp_path / "data", train, val or {})
    with pytest.raises(UsageError) as e:
        ImageFolderData(str(root), 16, workers=0)
    assert says.format(root=root) in str(e.value)


def test_a_missing_train_dir_ends_the_trainer_with_status_2(tmp_path: Path):
    proc = subprocess.run([sys.executable, "-m", "torchrig.train", "--dataset", "imagefolder",
                           "--data-dir", str(tmp_path), "--run-dir", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert (f"torchrig-train: error: --dataset imagefolder: {tmp_path}/train is missing; "
            "--data-dir must hold train/ and val/") in proc.stderr


def test_grey_alpha_and_odd_sized_files_make_one_batch(tmp_path: Path):
    from PIL import Image

    for split in ("train", "val"):
        for c, (mode, size) in enumerate([("L", (50, 20)), ("RGBA", (17, 33)), ("P", (9, 64))]):
            (tmp_path / split / f"c{c}").mkdir(parents=True)
            Image.new(mode, size).save(tmp_path / split / f"c{c}" / "x.png")
    data = ImageFolderData(str(tmp_path), 16, workers=0)
    x, y = next(data.train_batches([0, 1, 2], 3))
    assert tuple(x.shape) == (3, 3, 16, 16) and x.dtype == torch.float32
    assert y.tolist() == [0, 1, 2] and data.input_shape == [3, 16, 16]
