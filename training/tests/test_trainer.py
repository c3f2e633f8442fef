"""The Trainer in one process: its checkpoint (state_dict / load_state_dict, in the format
earlier versions wrote), a resume that continues the uninterrupted run exactly, a stop."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch

from torchrig import checkpoint, worker
from torchrig.config import Config
from torchrig.contract import FILES
from torchrig.dist import DistEnv
from torchrig.train import Trainer

# The keys of a checkpoint as torchrig has always written them: a checkpoint on a node's
# disk must keep loading after an upgrade.
CHECKPOINT_KEYS = ["model", "optimizer", "scheduler", "scaler", "step", "epoch",
                   "step_in_epoch", "global_batch", "world_size", "rng", "config"]


@pytest.fixture(autouse=True)
def restore_process_state(monkeypatch):
    """The Trainer sets its own SIGTERM handler (and main() the thread count); the test
    process gets its own back."""
    monkeypatch.delenv(worker.STOP_REQUESTED_ENV, raising=False)
    previous, threads = signal.getsignal(signal.SIGTERM), torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    signal.signal(signal.SIGTERM, previous)
    torch.set_num_threads(threads)


def single_env() -> DistEnv:
    return DistEnv(0, 0, 1, 1, torch.device("cpu"), None, 1, "host")


def trainer(run_dir: Path, **settings) -> Trainer:
    """A short run on scikit-learn's digits: 1438 samples, 89 steps an epoch of 16."""
    run_dir.mkdir(parents=True, exist_ok=True)  # main() makes it
    base = {"dataset": "digits", "batch_size": 16, "epochs": 2, "checkpoint_every": 5,
            "log_every": 5, "warmup_steps": 3, "run_dir": str(run_dir)}
    return Trainer(Config(**{**base, **settings}), single_env())


def metrics(run_dir: Path) -> list[dict]:
    records = [json.loads(line) for line in (run_dir / FILES["metrics"]).read_text().splitlines()]
    for r in records:
        r.pop("samples_per_s", None)  # timing, never equal
    return records


def same_tensors(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_state_dict_has_the_checkpoint_keys_and_round_trips(tmp_path: Path):
    t = trainer(tmp_path / "a", max_steps=7)
    assert t.train() == 0
    state = t.state_dict()
    assert list(state) == CHECKPOINT_KEYS
    assert (state["step"], state["epoch"], state["step_in_epoch"]) == (7, 0, 7)
    assert state["global_batch"] == 16 and state["config"]["max_steps"] == 7

    fresh = trainer(tmp_path / "b", max_steps=7, resume=False)
    fresh.load_state_dict(state)
    assert fresh.progress == t.progress
    assert same_tensors(fresh.raw_model.state_dict(), t.raw_model.state_dict())
    assert fresh.scheduler.state_dict() == t.scheduler.state_dict()
    assert fresh.optimizer.state_dict()["state"][0]["exp_avg"].equal(
        t.optimizer.state_dict()["state"][0]["exp_avg"])


def test_a_checkpoint_of_the_earlier_format_resumes(tmp_path: Path):
    """Written key by key as the trainer before the Trainer class wrote it."""
    t = trainer(tmp_path / "old", max_steps=10)
    t.train()
    old = {
        "model": t.raw_model.state_dict(), "optimizer": t.optimizer.state_dict(),
        "scheduler": t.scheduler.state_dict(), "scaler": t.scaler.state_dict(),
        "step": 10, "epoch": 0, "step_in_epoch": 10, "global_batch": 16, "world_size": 1,
        "rng": checkpoint.rng_state(torch.device("cpu")), "config": t.cfg.to_dict(),
    }
    run_dir = tmp_path / "new"
    checkpoint.save_atomic(old, checkpoint.path_for(run_dir / "checkpoints", 10))
    resumed = trainer(run_dir, max_steps=20)
    assert resumed.resumed_from == 10 and resumed.progress.step_in_epoch == 10
    assert same_tensors(resumed.raw_model.state_dict(), t.raw_model.state_dict())
    assert resumed.train() == 0
    assert json.loads((run_dir / FILES["summary"]).read_text())["resumed_from_step"] == 10


def test_resume_continues_the_uninterrupted_run_exactly(tmp_path: Path):
    """Across an epoch end, with gradient accumulation and clipping: stopped at step 50
    and resumed, the run ends with the uninterrupted run's weights and metrics."""
    flags = {"max_steps": 60, "grad_accum": 2, "clip_grad": 0.5,
             "optimizer": "sgd", "lr": 0.05}
    whole = trainer(tmp_path / "whole", **flags)
    assert whole.train() == 0
    split = tmp_path / "split"
    assert trainer(split, **{**flags, "max_steps": 50}).train() == 0
    resumed = trainer(split, **flags)
    assert resumed.resumed_from == 50
    assert resumed.train() == 0
    assert same_tensors(resumed.raw_model.state_dict(), whole.raw_model.state_dict())
    assert metrics(split) == metrics(tmp_path / "whole")
    assert [r["step"] for r in metrics(split) if r["split"] == "eval"] == [44, 60]
    assert checkpoint.list_steps(split / "checkpoints") == [50, 55, 60]


def test_a_stop_on_an_epochs_last_step_resumes_into_the_next_epoch(tmp_path: Path):
    """A SIGTERM on the last step of epoch 1 saves the whole epoch; the resumed run evaluates
    it, trains epoch 2 and ends as the uninterrupted run (it once indexed an empty rest of
    epoch 1 and failed with an IndexError, on every retry)."""
    flags = {"max_steps": 100, "optimizer": "sgd", "lr": 0.05}
    whole = trainer(tmp_path / "whole", **flags)
    assert whole.train() == 0
    cut = trainer(tmp_path / "cut", **flags)
    last = cut.steps_per_epoch
    step = cut.train_step

    def step_then_stop(x, y):
        step(x, y)
        if cut.progress.step == last - 1:  # the vote right after this step stops
            cut.stop.requested = True

    cut.train_step = step_then_stop
    assert cut.train() == 0
    assert (cut.progress.step, cut.progress.step_in_epoch, cut.progress.epoch) == (last, last, 0)
    assert not (tmp_path / "cut" / FILES["summary"]).exists()
    resumed = trainer(tmp_path / "cut", **flags)
    assert resumed.resumed_from == last
    assert resumed.train() == 0
    assert same_tensors(resumed.raw_model.state_dict(), whole.raw_model.state_dict())
    assert metrics(tmp_path / "cut") == metrics(tmp_path / "whole")
    assert [r["step"] for r in metrics(tmp_path / "cut") if r["split"] == "eval"] == [last, 100]


def test_a_stop_request_checkpoints_the_step_and_ends(tmp_path: Path, monkeypatch, caplog):
    """A SIGTERM kept by torchrig.worker before the Trainer existed: one step, saved."""
    monkeypatch.setenv(worker.STOP_REQUESTED_ENV, "1")
    t = trainer(tmp_path)
    assert t.train() == 0
    assert checkpoint.list_steps(tmp_path / "checkpoints") == [1]
    assert not (tmp_path / FILES["summary"]).exists()
    assert "stopped at step 1 on SIGTERM (received here)" in caplog.text
