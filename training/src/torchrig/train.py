"""torchrig-train: DDP training that survives restarts, under torchrun or as one process.

    torchrun --nproc-per-node 2 -m torchrig.train --dataset mnist5k --run-dir runs/a

Exit status: 0 done (or stopped by SIGTERM after a checkpoint), 2 bad usage, 1 failure.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import random
import signal
import sys
import time
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from . import checkpoint, dist, export
from . import records as records_file
from .config import Config, parse_config
from .contract import CHECKPOINT_DIR, FILES
from .data import Data, UsageError, load_dataset
from .dist import DistEnv
from .imagefolder import ImageFolderData
from .models import build_model
from .plot import plot_metrics
from .worker import STOP_REQUESTED_ENV

log = logging.getLogger("torchrig")


def lr_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warm-up to 1, then cosine down to `min_ratio` at `total` steps."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class StopRequest:
    """SIGTERM sets a flag; all ranks then finish the same step, checkpoint and exit 0.

    torchrun forwards SIGTERM only to its own node's workers, and a rank that left alone
    would hang the others in their next collective, so the ranks vote every step. The
    vote is an asynchronous all_reduce on the CPU control group, read one step later: it
    overlaps with the next step's compute instead of adding a round trip to every step.
    Every rank reads the same result after the same number of votes, so all stop at the
    same step.
    """

    def __init__(self, env: DistEnv) -> None:
        # A SIGTERM before this point (during rendezvous or set-up) was kept by
        # torchrig.worker; it counts as a request now.
        self.requested = os.environ.get(STOP_REQUESTED_ENV) == "1"
        self.env = env
        self.flag = torch.zeros(1, dtype=torch.int32)
        self.pending = None
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame) -> None:
        self.requested = True

    def vote(self) -> bool:
        """True, on every rank at once, when a rank has been asked to stop."""
        if self.env.world_size == 1:
            return self.requested
        if self.pending is not None:
            self.pending.wait()
            self.pending = None
            if self.flag.item():
                return True
        self.flag.fill_(int(self.requested))
        self.pending = dist.all_reduce_async_max(self.flag, self.env)
        return False

    def finish(self) -> None:
        if self.pending is not None:
            self.pending.wait()


class Outputs:
    """Rank 0's metrics records, TensorBoard events and log lines (or progress bar)."""

    def __init__(self, run_dir: Path, start_step: int, total_steps: int) -> None:
        self.metrics = run_dir / FILES["metrics"]
        self._trim(start_step)
        self.file = self.metrics.open("a")
        self.tb = None
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(run_dir / "tensorboard"), purge_step=start_step + 1)
        except ImportError:
            log.info("tensorboard is not installed: no TensorBoard events")
        self.bar = None
        if sys.stdout.isatty():
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total_steps, initial=start_step, unit="step")
            except ImportError:
                log.info("tqdm is not installed: log lines instead of a progress bar")

    def _trim(self, start_step: int) -> None:
        """Drop records a resumed run will write again, so the file reads as one run.

        The checkpoint of step s is written after the train record of step s and before
        the evaluation of step s, so those are the records to keep.
        """
        if not self.metrics.exists():
            return
        # A line cut short (a full disk, a power loss) is skipped and reported, not fatal:
        # the checkpoints are good, and a resume that failed on it would fail every time.
        records, _ = records_file.read_records(self.metrics)
        keep = [r for r in records
                if r["step"] < start_step or (r["step"] == start_step and r["split"] == "train")]
        records_file.write_atomic(self.metrics, "".join(json.dumps(r) + "\n" for r in keep))

    def record(self, rec: dict[str, Any]) -> None:
        self.file.write(json.dumps(rec) + "\n")
        self.file.flush()
        if self.tb is not None:
            for key in ("loss", "accuracy", "lr", "samples_per_s"):
                if key in rec:
                    self.tb.add_scalar(f"{rec['split']}/{key}", rec[key], rec["step"])
        if rec["split"] == "train" and self.bar is not None:
            self.bar.set_postfix(loss=f"{rec['loss']:.4f}", acc=f"{rec['accuracy']:.3f}")
            return
        extra = (f" lr {rec['lr']:.3g} {rec['samples_per_s']:.0f} samples/s"
                 if rec["split"] == "train" else "")
        self.say(f"{rec['split']} step {rec['step']} epoch {rec['epoch']} loss {rec['loss']:.4f} "
                 f"accuracy {rec['accuracy']:.4f}{extra}")

    def say(self, msg: str) -> None:
        if self.bar is not None:
            self.bar.write(msg)
        else:
            log.info(msg)

    def step(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        self.file.close()
        if self.tb is not None:
            self.tb.close()
        if self.bar is not None:
            self.bar.close()


@torch.no_grad()
def evaluate(model: torch.nn.Module, data: Data | ImageFolderData, env: DistEnv,
             batch_size: int, autocast, channels_last: bool) -> tuple[float, float]:
    """Held-out loss and accuracy over the whole test set, exactly.

    Each rank takes every world_size-th sample, without the padding DistributedSampler
    adds, and the sums and counts are all-reduced, so no sample counts twice.
    """
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=env.device)
    for x, y in data.test_batches(env.rank, env.world_size, batch_size):
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        with autocast():
            logits = model(x)
        sums[0] += F.cross_entropy(logits.float(), y, reduction="sum")
        sums[1] += (logits.argmax(1) == y).sum()
        sums[2] += len(y)
    dist.all_reduce_sum(sums)
    model.train()
    return (sums[0] / sums[2]).item(), (sums[1] / sums[2]).item()


def choose_precision(requested: str, capability: tuple[int, int] | None) -> str:
    """The precision to train in, from --precision and the GPU's compute capability
    (None: the CPU).

    auto: bf16 where the GPU has it in hardware (Ampere, 8.0, and newer), fp16 with loss
    scaling on Volta and Turing (7.x: fast fp16, bf16 only emulated), fp32 below and on
    the CPU. torch.cuda.is_bf16_supported() alone counts emulation, and is true on a V100
    or T4, so the capability decides. Asking for bf16 on such a GPU is an error.
    """
    if capability is None:
        return "fp32" if requested == "auto" else requested
    if requested == "auto":
        return "bf16" if capability >= (8, 0) else "fp16" if capability >= (7, 0) else "fp32"
    if requested == "bf16" and capability < (8, 0):
        raise UsageError(
            f"--precision bf16: this GPU (compute capability {capability[0]}.{capability[1]}) has "
            "no bf16 hardware, which starts at 8.0 (Ampere); torch would emulate it, slowly. "
            "Use --precision auto (fp16 with a gradient scaler on 7.x, fp32 below) or fp32")
    return requested


def capability(device: torch.device) -> tuple[int, int] | None:
    """The GPU's compute capability; None for the CPU."""
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else None


def auto_precision(device: torch.device) -> str:
    """--precision auto on this device (see choose_precision)."""
    return choose_precision("auto", capability(device))


def seed_everything(seed: int) -> None:
    # Every rank uses the same seed: identical initial weights, and one saved RNG state
    # (written by any node) restores every rank.
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_optimizer(cfg: Config, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
    # Fused kernels: one kernel per step instead of several per tensor. On the CPU the
    # default (foreach) AdamW step took 2.3-3.5 ms for this 0.2M-parameter CNN, the fused
    # one 0.65 ms.
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=True)
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum,
                           weight_decay=cfg.weight_decay, nesterov=cfg.momentum > 0, fused=True)


@dataclasses.dataclass
class Progress:
    """Where the run is; a checkpoint keeps these fields under their own names."""

    step: int = 0  # optimizer steps done
    epoch: int = 0  # epochs done
    step_in_epoch: int = 0  # optimizer steps done in the current epoch


class Window:
    """This rank's training metrics since the last train record, and the run's throughput.

    Loss, correct predictions and samples are summed on the device: no host sync per
    step, one per train record.
    """

    def __init__(self, device: torch.device) -> None:
        self.sums = torch.zeros(3, device=device)  # loss sum, correct, samples
        self.steps = 0
        self.t0 = time.perf_counter()
        self.train_time, self.train_samples = 0.0, 0
        self.rates: list[float] = []  # samples/s of each record, for the steady rate

    def add(self, loss: torch.Tensor, logits: torch.Tensor, y: torch.Tensor) -> None:
        """A micro-batch's loss (scaled by 1 / --grad-accum) and predictions."""
        self.sums[0] += loss.detach().float()
        self.sums[1] += (logits.argmax(1) == y).sum()

    def end_step(self, samples: int) -> None:
        """An optimizer step of `samples` samples (on this rank) is done."""
        self.sums[2] += samples
        self.steps += 1

    def restart_clock(self) -> None:
        """Evaluation is not training time."""
        self.t0 = time.perf_counter()

    def close(self, global_batch: int) -> tuple[torch.Tensor, float]:
        """All ranks' sums and the global samples/s of the window; starts the next one."""
        sums = dist.all_reduce_sum(self.sums.clone())
        if self.sums.device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - self.t0
        samples = self.steps * global_batch
        self.train_time += dt
        self.train_samples += samples
        self.rates.append(samples / dt)
        self.sums.zero_()
        self.steps, self.t0 = 0, time.perf_counter()
        return sums, samples / dt

    def samples_per_s(self) -> float | None:
        return self.train_samples / self.train_time if self.train_time else None

    def steady_samples_per_s(self) -> float | None:
        # The median window after the first: the first holds cuDNN autotuning and
        # torch.compile, which on a GPU can cost more than a short run's training.
        return float(np.median(self.rates[1:])) if len(self.rates) > 1 else None


class Trainer:
    """One rank's training run: its parts, built in __init__, and the loop.

    Parts: data (the whole set on the device, or, for imagefolder, file paths streamed
    through DataLoader workers), raw_model (the module itself, what is
    saved and evaluated) and model (raw_model under DDP and torch.compile, what is
    trained), optimizer, scheduler, scaler (active in fp16 only), sampler (data order), stop
    (the SIGTERM vote), window (metrics) and, on rank 0, out (metrics files and log).

        trainer = Trainer(cfg, env)   # builds, and resumes from the newest checkpoint
        trainer.train()               # train_step after train_step, evaluating each epoch

    state_dict() and load_state_dict() are the checkpoint's one definition.
    """

    def __init__(self, cfg: Config, env: DistEnv) -> None:
        self.t_start = time.perf_counter()
        self.cfg, self.env = cfg, env
        self.run_dir = Path(cfg.run_dir)
        self.ckpt_dir = self.run_dir / CHECKPOINT_DIR
        self.stop = StopRequest(env)  # first thing: a SIGTERM during set-up must not kill us
        seed_everything(cfg.seed)
        self.data = self._load_data()

        self.raw_model = build_model(cfg.model, self.data.in_channels, self.data.num_classes,
                                     self.data.image_size).to(env.device)
        if cfg.channels_last:
            self.raw_model = self.raw_model.to(memory_format=torch.channels_last)
        self.optimizer = build_optimizer(cfg, self.raw_model.parameters())

        # The whole global batch is one slice of one permutation whatever the world size,
        # so runs with the same global batch see the same samples at each step.
        self.sampler = DistributedSampler(range(self.data.train_size),
                                          num_replicas=env.world_size, rank=env.rank,
                                          shuffle=True, seed=cfg.seed)
        self.steps_per_epoch = len(self.sampler) // cfg.batch_size // cfg.grad_accum
        self.global_batch = cfg.batch_size * cfg.grad_accum * env.world_size
        if self.steps_per_epoch == 0:
            raise UsageError(f"--batch-size x --grad-accum x world size = {self.global_batch} "
                             f"is more than the {self.data.train_size} training samples")
        total_steps = self.steps_per_epoch * cfg.epochs
        self.last_step = min(total_steps, cfg.max_steps) if cfg.max_steps else total_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, partial(
            lr_factor, warmup=cfg.warmup_steps, total=total_steps, min_ratio=cfg.min_lr_ratio))

        self.precision = choose_precision(cfg.precision, capability(env.device))
        amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision)
        self.autocast = partial(torch.autocast, env.device.type, dtype=amp_dtype,
                                enabled=amp_dtype is not None)
        self.scaler = torch.amp.GradScaler(env.device.type, enabled=self.precision == "fp16")

        self.progress = Progress()
        self.resumed_from: int | None = None
        self._clear_earlier_results()
        if cfg.resume:
            self.resume()

        self.model: torch.nn.Module = self.raw_model
        if env.world_size > 1:
            self.model = DDP(self.raw_model, device_ids=[env.device.index]
                             if env.device.type == "cuda" else None)
        self.ddp = self.model  # what no_sync() is called on
        if cfg.compile:
            self.model = torch.compile(self.model)

        self.hosts = dist.all_gather_object(env.hostname, env)
        self.out = self._open_outputs() if env.is_main else None
        self.saved_step: int | None = None  # the step of this run's newest checkpoint
        self.result: tuple[int, float, float] | None = None  # step, loss, accuracy: last eval
        self.window = Window(env.device)  # last: its clock starts with the training

    # --- building --------------------------------------------------------------------

    def _load_data(self) -> Data | ImageFolderData:
        cfg, env = self.cfg, self.env
        # With --download, each node's local rank 0 fetches first; the others wait, so no
        # two processes write the same files.
        fetch = cfg.download and env.local_rank == 0
        if cfg.download and not fetch:
            dist.barrier(env)
        data = load_dataset(cfg.dataset, cfg.data_dir, fetch, cfg.synthetic_shape,
                            cfg.synthetic_samples, cfg.image_size, cfg.workers)
        if fetch:
            dist.barrier(env)
        return data.to(env.device)

    def _clear_earlier_results(self) -> None:
        if self.env.local_rank == 0:
            checkpoint.remove_stale_temps(self.ckpt_dir)
            # Rank 0 may land on another node this time: a summary or model left
            # here by an earlier attempt would then read as this run's result.
            (self.run_dir / FILES["summary"]).unlink(missing_ok=True)
            export.remove_model(self.run_dir)

    def _open_outputs(self) -> Outputs:
        cfg, env, data = self.cfg, self.env, self.data
        (self.run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        out = Outputs(self.run_dir, self.progress.step, self.last_step)
        params = sum(p.numel() for p in self.raw_model.parameters())
        out.say(f"{cfg.dataset}: {data.train_size} train / {data.test_size} held-out, "
                f"model {cfg.model} ({params} params), world {env.world_size} on "
                f"{len(set(self.hosts))} host(s), global batch {self.global_batch}, "
                f"{self.steps_per_epoch} steps/epoch, {self.last_step} steps, "
                f"{self.precision}, {env.threads} threads/process, device {env.device.type}")
        return out

    # --- checkpoints -----------------------------------------------------------------

    def _stateful(self) -> dict[str, Any]:
        """The parts that have a state_dict of their own, by their checkpoint key."""
        return {"model": self.raw_model, "optimizer": self.optimizer,
                "scheduler": self.scheduler, "scaler": self.scaler}

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint holds. global_batch, world_size and config describe the run
        that wrote it: a resume warns when global_batch differs, and people read the rest."""
        return {
            **{key: part.state_dict() for key, part in self._stateful().items()},
            **dataclasses.asdict(self.progress),
            "global_batch": self.global_batch, "world_size": self.env.world_size,
            "rng": checkpoint.rng_state(self.env.device), "config": self.cfg.to_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, part in self._stateful().items():
            part.load_state_dict(state[key])
        checkpoint.set_rng_state(state["rng"], self.env.device)
        self.progress = Progress(**{f.name: state[f.name]
                                    for f in dataclasses.fields(Progress)})
        if state["global_batch"] != self.global_batch:
            log.warning("the checkpoint was written with global batch %d, this run has %d: "
                        "the position within the epoch is approximate",
                        state["global_batch"], self.global_batch)

    def resume(self) -> None:
        """Load the newest checkpoint every rank agrees on, if there is one."""
        found, state = checkpoint.agree_on_resume(self.ckpt_dir, self.env)
        if state is None:
            return
        self.load_state_dict(state)
        self.resumed_from = found
        p = self.progress
        log.info("resumed from step %d (epoch %d, step %d of %d in it)", p.step, p.epoch,
                 p.step_in_epoch, self.steps_per_epoch)

    def save_checkpoint(self) -> None:
        if self.env.local_rank == 0:  # one copy per node: resume needs no shared storage
            step = self.progress.step
            checkpoint.save_atomic(self.state_dict(), checkpoint.path_for(self.ckpt_dir, step))
            checkpoint.prune(self.ckpt_dir, self.cfg.keep_checkpoints, newest=step)
        self.saved_step = self.progress.step

    # --- training --------------------------------------------------------------------

    def train_step(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        """One optimizer step on this rank's share of the global batch, in --grad-accum
        micro-batches."""
        cfg = self.cfg
        micro_batches = list(zip(images.split(cfg.batch_size), labels.split(cfg.batch_size),
                                 strict=True))
        for micro, (x, y) in enumerate(micro_batches):
            if cfg.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            # Gradients are all-reduced only on the last micro-step of a step.
            last = micro == len(micro_batches) - 1
            sync = (self.ddp.no_sync() if self.ddp is not self.raw_model and not last
                    else contextlib.nullcontext())
            with sync:
                with self.autocast():
                    logits = self.model(x)
                    loss = F.cross_entropy(logits, y) / cfg.grad_accum
                self.scaler.scale(loss).backward()
            self.window.add(loss, logits, y)
        if cfg.clip_grad > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), cfg.clip_grad)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.window.end_step(len(labels))

    def train_epoch(self) -> bool:
        """The rest of the current epoch, or up to the last step; True when the ranks
        agreed to stop (a checkpoint is then saved)."""
        cfg, p = self.cfg, self.progress
        self.sampler.set_epoch(p.epoch)
        per_step = cfg.batch_size * cfg.grad_accum
        # The steps of this epoch not done yet: a resumed run reads none of the others.
        order = list(self.sampler)[p.step_in_epoch * per_step:self.steps_per_epoch * per_step]
        self.model.train()
        for x, y in self.data.train_batches(order, per_step):
            self.train_step(x, y)
            p.step, p.step_in_epoch = p.step + 1, p.step_in_epoch + 1
            if self.out is not None:
                self.out.step()
            stopped = self.stop.vote()
            ckpt_due = cfg.checkpoint_every > 0 and p.step % cfg.checkpoint_every == 0
            if (p.step % cfg.log_every == 0 or ckpt_due or stopped or p.step == self.last_step
                    or p.step_in_epoch == self.steps_per_epoch):
                self.log_train()
            if ckpt_due or stopped:
                self.save_checkpoint()
            if stopped:
                return True
            if p.step >= self.last_step:
                break
        return False

    def epochs_done(self) -> float:
        """Epochs done, fractional (1.0 = the end of the first), as the records give it."""
        p = self.progress
        return round(p.epoch + p.step_in_epoch / self.steps_per_epoch, 4)

    def log_train(self) -> None:
        sums, samples_per_s = self.window.close(self.global_batch)
        if self.out is not None:
            cfg = self.cfg
            self.out.record({"split": "train", "step": self.progress.step,
                             "epoch": self.epochs_done(),
                             "loss": (sums[0] * cfg.grad_accum * cfg.batch_size / sums[2]).item(),
                             "accuracy": (sums[1] / sums[2]).item(),
                             "lr": self.scheduler.get_last_lr()[0],
                             "samples_per_s": samples_per_s})

    def evaluate_held_out(self, epoch: float) -> None:
        """Evaluate on the held-out set and record it under `epoch` (epochs done)."""
        loss, acc = evaluate(self.raw_model, self.data, self.env, self.cfg.eval_batch_size,
                             self.autocast, self.cfg.channels_last)
        self.result = (self.progress.step, loss, acc)
        if self.out is not None:
            self.out.record({"split": "eval", "step": self.progress.step, "epoch": epoch,
                             "loss": loss, "accuracy": acc})

    def train(self) -> int:
        """Train to --epochs or --max-steps, then finish; or stop on SIGTERM. Returns 0."""
        p = self.progress
        stopped = False
        while p.epoch < self.cfg.epochs:
            # A run stopped on an epoch's last step saved the whole epoch: its resume
            # goes straight to the epoch's end.
            if p.step_in_epoch < self.steps_per_epoch and p.step < self.last_step:
                stopped = self.train_epoch()
                if stopped:
                    break
            if p.step_in_epoch == self.steps_per_epoch:
                self.evaluate_held_out(p.epoch + 1)
                p.epoch, p.step_in_epoch = p.epoch + 1, 0
                self.window.restart_clock()
            elif p.step >= self.last_step:
                break
        self.stop.finish()
        if stopped:
            # On every rank, so each node's journal says why its workers exited.
            log.warning("rank %d: stopped at step %d on SIGTERM (%s), checkpoint saved; "
                        "exiting 0", self.env.rank, p.step,
                        "received here" if self.stop.requested else "on another rank")
            if self.out is not None:
                self.out.close()
            return 0
        self.finish()
        return 0

    # --- the end ---------------------------------------------------------------------

    def finish(self) -> None:
        """The final evaluation and checkpoint; on rank 0, the exported model and summary."""
        p = self.progress
        if self.result is None or self.result[0] != p.step:
            # --max-steps ended mid-epoch, or resumed at the very end
            self.evaluate_held_out(self.epochs_done())
        if self.saved_step != p.step:
            self.save_checkpoint()
        if self.out is None:
            return
        self.out.close()
        _, loss, accuracy = self.result
        cfg, data = self.cfg, self.data
        summary = {
            "accuracy": accuracy, "loss": loss, "world_size": self.env.world_size,
            "epochs": cfg.epochs, "steps": p.step, "global_batch": self.global_batch,
            "samples_per_s": self.window.samples_per_s(),
            "samples_per_s_steady": self.window.steady_samples_per_s(),
            "resumed_from_step": self.resumed_from, "nodes": self.hosts,
            "duration_s": time.perf_counter() - self.t_start, "dataset": cfg.dataset,
            "model": cfg.model, "precision": self.precision,
            "threads_per_process": self.env.threads,
        }
        # The final model, weights only, with what rebuilds it (torchrig-eval, README);
        # before the summary, which says the run is complete.
        export.save_model(self.run_dir, self.raw_model, {
            "model": cfg.model, "dataset": cfg.dataset, "num_classes": data.num_classes,
            "classes": data.classes, "input_shape": data.input_shape,
            "mean": data.mean, "std": data.std, "accuracy": accuracy, "loss": loss,
            "held_out_samples": data.test_size, "steps": p.step, "epochs": cfg.epochs,
            "precision": self.precision, "seed": cfg.seed, "torch": torch.__version__,
            # What regenerates the same synthetic images for torchrig-eval.
            "synthetic_shape": cfg.synthetic_shape, "synthetic_samples": cfg.synthetic_samples,
        })
        (self.run_dir / FILES["summary"]).write_text(json.dumps(summary, indent=2) + "\n")
        try:
            plot_metrics(self.out.metrics, self.run_dir / "metrics.png")
        except ImportError:
            log.info("matplotlib is not installed: no metrics.png")
        log.info("done: held-out accuracy %.4f, loss %.4f, %d steps, %.0f samples/s",
                 accuracy, loss, p.step, summary["samples_per_s"] or 0)


@record  # under torchrun, a worker's exception and traceback reach torchrun's error report
def main(argv: list[str] | None = None) -> int:
    cfg = parse_config(argv)  # exits 2 with a message naming the flag on a bad value
    if cfg.deterministic:
        dist.make_deterministic()  # before any CUDA work
    try:
        env = dist.setup(cfg.threads)
    except dist.DeviceError as e:  # exit status 2: torchrig.worker ends the job, no retries
        print(f"torchrig-train: error: {e}", file=sys.stderr, flush=True)
        return 2
    logging.basicConfig(
        level=logging.INFO if env.is_main else logging.WARNING, stream=sys.stdout,
        format=f"%(asctime)s torchrig[rank {env.rank}] %(levelname)s %(message)s")
    # Every rank says where it runs: each node's journal then shows its own ranks.
    print(f"torchrig: rank {env.rank} local_rank {env.local_rank} world_size {env.world_size} "
          f"host {env.hostname} pid {os.getpid()} device {env.device} threads {env.threads} "
          f"backend {env.backend or 'none'}", flush=True)
    Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
    pid_file = Path(cfg.run_dir) / f"worker-rank{env.rank}.pid"  # lets an operator find us
    pid_file.write_text(f"{os.getpid()}\n")
    try:
        return Trainer(cfg, env).train()
    except UsageError as e:
        if env.local_rank == 0:
            print(f"torchrig-train: error: {e}", file=sys.stderr, flush=True)
        return 2
    finally:
        # A stop reaches the nodes a moment apart, so a worker that has already saved
        # and is exiting can still be sent SIGTERM. Python's shutdown puts the default
        # action back for signals it handled (not for ignored ones): the late signal
        # would kill the worker, torchrun would count a failure and restart the group.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        pid_file.unlink(missing_ok=True)
        dist.teardown()


if __name__ == "__main__":
    sys.exit(main())
