"""The exported model: what train.py writes, what torchrig-eval makes of it, and which
checkpoints a node keeps."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from launch import child_env, read_summary
from torchrig import checkpoint, evaluate, export
from torchrig.contract import FILES
from torchrig.data import load_dataset

PACKAGE = Path(__file__).resolve().parents[1]


def eval_cli(*args: str) -> subprocess.CompletedProcess[str]:
    # Run as torchrig-eval runs: a fresh interpreter, on the CPU.
    return subprocess.run([sys.executable, "-m", "torchrig.evaluate", *args], capture_output=True,
                          text=True, timeout=180, env=child_env())


def test_eval_of_the_exported_model_gives_the_summary_accuracy(reference_run: Path):
    """The 2-process reference run's model, evaluated the way a user would on the controller:
    the held-out accuracy of the run's summary within 0.002, the loss within 1 %."""
    summary = read_summary(reference_run)
    meta = json.loads((reference_run / "model.json").read_text())
    assert meta["model"] == "cnn" and meta["dataset"] == "mnist5k"
    assert meta["input_shape"] == [1, 28, 28] and meta["classes"] == [str(c) for c in range(10)]
    assert meta["accuracy"] == summary["accuracy"] and meta["steps"] == summary["steps"]
    done = eval_cli(str(reference_run), "--device", "cpu")
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith("accuracy: ") and "held-out, 1000 images of mnist5k" in first
    as_json = eval_cli(str(reference_run), "--device", "cpu", "--json")
    result = json.loads(as_json.stdout)
    assert abs(result["accuracy"] - summary["accuracy"]) <= 0.002
    assert result["loss"] == pytest.approx(summary["loss"], rel=0.01)
    assert f"accuracy: {result['accuracy']:.4f}" == first.split(" loss")[0]


def test_model_rebuilt_from_its_files_as_the_readme_shows(tmp_path: Path):
    """A short resnet18 run (channels-last weights): the weights file holds every tensor of
    the model, the header holds the metadata too, and the README's few lines classify raw
    images the way the trainer evaluated them."""
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "torchrig.train", "--run-dir", str(run), "--threads", "1",
           "--dataset", "digits", "--model", "resnet18", "--channels-last", "--max-steps", "5",
           "--batch-size", "16"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=child_env())
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    summary = json.loads((run / FILES["summary"]).read_text())

    model, meta = export.load_model(run)
    assert not model.training and meta["model"] == "resnet18" and meta["input_shape"] == [1, 8, 8]
    with safe_open(str(run / "model.safetensors"), framework="pt") as f:
        assert set(f.keys()) == set(model.state_dict())
        assert json.loads(f.metadata()["torchrig"]) == meta
    # Raw 8x8 digits (0-16), normalised with the metadata: the held-out accuracy again.
    from torchrig.data import load_csv_images, package_data_file, stratified_split

    x, y = load_csv_images(package_data_file("sklearn", "datasets/data/digits.csv.gz", "d"), 8)
    _, test = stratified_split(y, 0.2)
    with torch.no_grad():
        pred = model(export.normalise(torch.as_tensor(x[test]), meta)).argmax(1)
    accuracy = (pred == torch.as_tensor(y[test])).float().mean().item()
    assert abs(accuracy - summary["accuracy"]) <= 0.002

    # Without model.json the header is enough.
    (run / "model.json").unlink()
    assert export.read_meta(run) == meta


def test_eval_names_what_is_wrong_with_a_run_directory(tmp_path: Path):
    missing = eval_cli(str(tmp_path / "nope"))
    assert missing.returncode == 2
    assert f"{tmp_path / 'nope'}: no such directory" in missing.stderr

    no_model = tmp_path / "script-job"
    no_model.mkdir()
    (no_model / FILES["summary"]).write_text("{}")
    done = eval_cli(str(no_model))
    assert done.returncode == 2 and "has no model.safetensors" in done.stderr

    torch.manual_seed(0)
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "model.safetensors").write_bytes(b"not a safetensors file")
    (odd / "model.json").write_text("[1, 2]")
    done = eval_cli(str(odd))
    assert done.returncode == 2 and "not a torchrig model description" in done.stderr

    # Weights of another model than the metadata names.
    data = load_dataset("digits")
    from torchrig.models import build_model

    export.save_model(odd, build_model("cnn", 1, 10, 8), {
        "model": "cnn", "dataset": "digits", "num_classes": 10, "input_shape": [1, 8, 8],
        "mean": data.mean, "std": data.std})
    meta = json.loads((odd / "model.json").read_text())
    (odd / "model.json").write_text(json.dumps({**meta, "model": "resnet18"}))
    done = eval_cli(str(odd))
    assert done.returncode == 2 and "does not load into model 'resnet18'" in done.stderr

    if not torch.cuda.is_available():
        with pytest.raises(evaluate.UsageError, match="no CUDA device is usable here"):
            evaluate.pick_device("cuda")


def test_torchrig_eval_is_a_console_script_and_safetensors_a_dependency():
    # Read as text: tomllib is Python 3.11+, the package supports 3.10.
    text = (PACKAGE / "pyproject.toml").read_text()
    assert 'torchrig-eval = "torchrig.evaluate:main"' in text
    deps = text.split("dependencies = [", 1)[1].split("]", 1)[0]
    assert '"safetensors' in deps


# --- checkpoint retention -----------------------------------------------------------------

def fake(step: int) -> dict:
    return {"model": {}, "step": step}


def test_keep_k_never_drops_the_checkpoint_a_resume_needs(tmp_path: Path):
    """A run started again with --no-resume (or resumed from an older step than one node
    held) finds later steps of the run it replaced. They must not push the checkpoint it
    just wrote out, or the next resume would go back to the replaced run."""
    for step in (400, 500, 600):  # the replaced run's
        checkpoint.save_atomic(fake(step), checkpoint.path_for(tmp_path, step))
    for step in (100, 200, 300, 400):
        checkpoint.save_atomic(fake(step), checkpoint.path_for(tmp_path, step))
        checkpoint.prune(tmp_path, 3, newest=step)
        assert checkpoint.list_steps(tmp_path)[-1] == step
    assert checkpoint.list_steps(tmp_path) == [200, 300, 400]
    env = evaluate.DistEnv(0, 0, 1, 1, torch.device("cpu"), None, 1, "host")
    assert checkpoint.agree_on_resume(tmp_path, env)[0] == 400

    # keep=1 keeps exactly the one just written.
    checkpoint.save_atomic(fake(450), checkpoint.path_for(tmp_path, 450))
    checkpoint.prune(tmp_path, 1, newest=450)
    assert checkpoint.list_steps(tmp_path) == [450]


def test_the_trainer_keeps_the_newest_k(tmp_path: Path):
    """--keep-checkpoints 2 with a checkpoint every 5 of 20 steps, over a replaced run's
    later files: the node ends with this run's last two."""
    ckpt = tmp_path / "checkpoints"
    for step in (25, 30):
        checkpoint.save_atomic(fake(step), checkpoint.path_for(ckpt, step))
    cmd = [sys.executable, "-m", "torchrig.train", "--run-dir", str(tmp_path), "--threads", "1",
           "--dataset", "digits", "--max-steps", "20", "--checkpoint-every", "5",
           "--keep-checkpoints", "2", "--no-resume"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=child_env())
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert checkpoint.list_steps(ckpt) == [15, 20]
