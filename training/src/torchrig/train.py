"""torchrig-train: DDP training that survives restarts, under torchrun or as one process.

    torchrun --nproc-per-node 2 -m torchrig.train --dataset mnist5k --run-dir runs/a

Exit status: 0 done (or stopped by SIGTERM after a checkpoint), 2 bad usage, 1 failure.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
import signal
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from . import checkpoint, dist, export
from .config import Config, parse_config
from .data import Data, UsageError, load_dataset
from .dist import DistEnv
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
    """Rank 0's metrics.jsonl, TensorBoard events and log lines (or progress bar)."""

    def __init__(self, run_dir: Path, start_step: int, total_steps: int) -> None:
        self.metrics = run_dir / "metrics.jsonl"
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
        keep = [line for line in self.metrics.read_text().splitlines() if line and (
            (r := json.loads(line))["step"] < start_step
            or (r["step"] == start_step and r["split"] == "train"))]
        self.metrics.write_text("".join(line + "\n" for line in keep))

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
def evaluate(model: torch.nn.Module, data: Data, env: DistEnv, batch_size: int,
             autocast, channels_last: bool) -> tuple[float, float]:
    """Held-out loss and accuracy over the whole test set, exactly.

    Each rank takes every world_size-th sample, without the padding DistributedSampler
    adds, and the sums and counts are all-reduced, so no sample counts twice.
    """
    model.eval()
    idx = torch.arange(env.rank, len(data.test_y), env.world_size, device=env.device)
    sums = torch.zeros(3, dtype=torch.float64, device=env.device)
    for j in range(0, len(idx), batch_size):
        b = idx[j:j + batch_size]
        x, y = data.test_x[b], data.test_y[b]
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        with autocast():
            logits = model(x)
        sums[0] += F.cross_entropy(logits.float(), y, reduction="sum")
        sums[1] += (logits.argmax(1) == y).sum()
        sums[2] += len(b)
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


def auto_precision(device: torch.device) -> str:
    """--precision auto on this device (see choose_precision)."""
    return choose_precision("auto", torch.cuda.get_device_capability(device)
                            if device.type == "cuda" else None)


def seed_everything(seed: int) -> None:
    # Every rank uses the same seed: identical initial weights, and one saved RNG state
    # (written by any node) restores every rank.
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def train(cfg: Config, env: DistEnv) -> int:
    t_start = time.perf_counter()
    run_dir = Path(cfg.run_dir)
    ckpt_dir = run_dir / "checkpoints"
    stop = StopRequest(env)  # first thing: a SIGTERM during set-up must not kill us either
    seed_everything(cfg.seed)

    # With --download, each node's local rank 0 fetches first; the others wait, so no two
    # processes write the same files.
    if cfg.download and env.local_rank != 0:
        dist.barrier(env)
    data = load_dataset(cfg.dataset, cfg.data_dir, cfg.download and env.local_rank == 0)
    if cfg.download and env.local_rank == 0:
        dist.barrier(env)
    data = data.to(env.device)

    raw_model = build_model(cfg.model, data.in_channels, data.num_classes, data.image_size)
    raw_model = raw_model.to(env.device)
    if cfg.channels_last:
        raw_model = raw_model.to(memory_format=torch.channels_last)
    # Fused kernels: one kernel per step instead of several per tensor. On the CPU the
    # default (foreach) AdamW step took 2.3-3.5 ms for this 0.2M-parameter CNN, the fused
    # one 0.65 ms.
    if cfg.optimizer == "adamw":
        opt = torch.optim.AdamW(raw_model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                                fused=True)
    else:
        opt = torch.optim.SGD(raw_model.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                              weight_decay=cfg.weight_decay, nesterov=cfg.momentum > 0,
                              fused=True)

    # The whole global batch is one slice of one permutation whatever the world size, so
    # runs with the same global batch see the same samples at each step.
    sampler = DistributedSampler(range(len(data.train_y)), num_replicas=env.world_size,
                                 rank=env.rank, shuffle=True, seed=cfg.seed)
    steps_per_epoch = len(sampler) // cfg.batch_size // cfg.grad_accum
    global_batch = cfg.batch_size * cfg.grad_accum * env.world_size
    if steps_per_epoch == 0:
        raise UsageError(f"--batch-size x --grad-accum x world size = {global_batch} is more "
                         f"than the {len(data.train_y)} training samples")
    total_steps = steps_per_epoch * cfg.epochs
    last_step = min(total_steps, cfg.max_steps) if cfg.max_steps else total_steps
    sched = torch.optim.lr_scheduler.LambdaLR(opt, partial(
        lr_factor, warmup=cfg.warmup_steps, total=total_steps, min_ratio=cfg.min_lr_ratio))

    precision = choose_precision(cfg.precision, torch.cuda.get_device_capability(env.device)
                                 if env.device.type == "cuda" else None)
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    autocast = partial(torch.autocast, env.device.type, dtype=amp_dtype,
                       enabled=amp_dtype is not None)
    scaler = torch.amp.GradScaler(env.device.type, enabled=precision == "fp16")

    step, epoch, step_in_epoch, resumed_from = 0, 0, 0, None
    if env.local_rank == 0:
        checkpoint.remove_stale_temps(ckpt_dir)
        # Rank 0 may land on another node this time: a summary.json or model left here
        # by an earlier attempt would then read as this run's result.
        (run_dir / "summary.json").unlink(missing_ok=True)
        export.remove_model(run_dir)
    if cfg.resume:
        found, state = checkpoint.agree_on_resume(ckpt_dir, env)
        if state is not None:
            raw_model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            sched.load_state_dict(state["scheduler"])
            scaler.load_state_dict(state["scaler"])
            checkpoint.set_rng_state(state["rng"], env.device)
            step, epoch, step_in_epoch = state["step"], state["epoch"], state["step_in_epoch"]
            resumed_from = found
            if state["global_batch"] != global_batch:
                log.warning("the checkpoint was written with global batch %d, this run has %d: "
                            "the position within the epoch is approximate",
                            state["global_batch"], global_batch)
            log.info("resumed from step %d (epoch %d, step %d of %d in it)", step, epoch,
                     step_in_epoch, steps_per_epoch)
            del state

    model: torch.nn.Module = raw_model
    if env.world_size > 1:
        model = DDP(raw_model, device_ids=[env.device.index] if env.device.type == "cuda"
                    else None)
    ddp = model
    if cfg.compile:
        model = torch.compile(model)

    hosts = dist.all_gather_object(env.hostname, env)
    out = None
    if env.is_main:
        (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        out = Outputs(run_dir, step, last_step)
        out.say(f"{cfg.dataset}: {len(data.train_y)} train / {len(data.test_y)} held-out, "
                f"model {cfg.model} ({sum(p.numel() for p in raw_model.parameters())} params), "
                f"world {env.world_size} on {len(set(hosts))} host(s), global batch "
                f"{global_batch}, {steps_per_epoch} steps/epoch, {last_step} steps, "
                f"{precision}, {env.threads} threads/process, device {env.device.type}")

    def save() -> None:
        if env.local_rank == 0:  # one copy per node: resume needs no shared storage
            state = {
                "model": raw_model.state_dict(), "optimizer": opt.state_dict(),
                "scheduler": sched.state_dict(), "scaler": scaler.state_dict(),
                "step": step, "epoch": epoch, "step_in_epoch": step_in_epoch,
                "global_batch": global_batch, "world_size": env.world_size,
                "rng": checkpoint.rng_state(env.device), "config": cfg.to_dict(),
            }
            checkpoint.save_atomic(state, checkpoint.path_for(ckpt_dir, step))
            checkpoint.prune(ckpt_dir, cfg.keep_checkpoints, newest=step)

    window = torch.zeros(3, device=env.device)  # loss sum, correct, samples (this rank)
    window_steps, window_t0 = 0, time.perf_counter()
    train_time, train_samples = 0.0, 0
    window_rates: list[float] = []  # samples/s of each logged window, for the steady rate
    saved_step, eval_step, result = None, None, None
    stopped = False

    def log_train() -> None:
        nonlocal window_steps, window_t0, train_time, train_samples
        w = dist.all_reduce_sum(window.clone())
        if env.device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - window_t0
        samples = window_steps * global_batch
        train_time += dt
        train_samples += samples
        window_rates.append(samples / dt)
        if out is not None:
            # epoch: epochs done, fractional, as in the eval records (1.0 = end of the first)
            out.record({"split": "train", "step": step,
                        "epoch": round(epoch + step_in_epoch / steps_per_epoch, 4),
                        "loss": (w[0] * cfg.grad_accum * cfg.batch_size / w[2]).item(),
                        "accuracy": (w[1] / w[2]).item(), "lr": sched.get_last_lr()[0],
                        "samples_per_s": samples / dt})
        window.zero_()
        window_steps, window_t0 = 0, time.perf_counter()

    while epoch < cfg.epochs and step < last_step:
        sampler.set_epoch(epoch)
        order = torch.tensor(list(sampler), device=env.device)
        model.train()
        for i in range(step_in_epoch, steps_per_epoch):
            for micro in range(cfg.grad_accum):
                j = (i * cfg.grad_accum + micro) * cfg.batch_size
                b = order[j:j + cfg.batch_size]
                x, y = data.train_x[b], data.train_y[b]
                if cfg.channels_last:
                    x = x.contiguous(memory_format=torch.channels_last)
                # Gradients are all-reduced only on the last micro-step of a step.
                sync = (ddp.no_sync() if ddp is not raw_model and micro < cfg.grad_accum - 1
                        else contextlib.nullcontext())
                with sync:
                    with autocast():
                        logits = model(x)
                        loss = F.cross_entropy(logits, y) / cfg.grad_accum
                    scaler.scale(loss).backward()
                # Accumulated on the device: no host sync per step, one per log line.
                window[0] += loss.detach().float()
                window[1] += (logits.argmax(1) == y).sum()
            window[2] += cfg.batch_size * cfg.grad_accum
            if cfg.clip_grad > 0:
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(raw_model.parameters(), cfg.clip_grad)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
            sched.step()
            step, step_in_epoch, window_steps = step + 1, i + 1, window_steps + 1
            if out is not None:
                out.step()
            stopped = stop.vote()
            ckpt_due = cfg.checkpoint_every > 0 and step % cfg.checkpoint_every == 0
            if (step % cfg.log_every == 0 or ckpt_due or stopped or step == last_step
                    or step_in_epoch == steps_per_epoch):
                log_train()
            if ckpt_due or stopped:
                save()
                saved_step = step
            if stopped or step >= last_step:
                break
        if stopped:
            break
        if step_in_epoch == steps_per_epoch:
            loss, acc = evaluate(raw_model, data, env, cfg.eval_batch_size, autocast,
                                 cfg.channels_last)
            eval_step, result = step, (loss, acc)
            if out is not None:
                out.record({"split": "eval", "step": step, "epoch": epoch + 1, "loss": loss,
                            "accuracy": acc})
            epoch, step_in_epoch = epoch + 1, 0
            window_t0 = time.perf_counter()  # evaluation is not training time

    stop.finish()
    if stopped:
        # On every rank, so each node's journal says why its workers exited.
        log.warning("rank %d: stopped at step %d on SIGTERM (%s), checkpoint saved; exiting 0",
                    env.rank, step, "received here" if stop.requested else "on another rank")
        if out is not None:
            out.close()
        return 0

    if eval_step != step:  # --max-steps ended mid-epoch, or resumed at the very end
        result = evaluate(raw_model, data, env, cfg.eval_batch_size, autocast, cfg.channels_last)
        if out is not None:
            out.record({"split": "eval", "step": step,
                        "epoch": round(epoch + step_in_epoch / steps_per_epoch, 4),
                        "loss": result[0], "accuracy": result[1]})
    if saved_step != step:
        save()
    if out is not None:
        out.close()
        summary = {
            "accuracy": result[1], "loss": result[0], "world_size": env.world_size,
            "epochs": cfg.epochs, "steps": step, "global_batch": global_batch,
            "samples_per_s": train_samples / train_time if train_time else None,
            # The median window after the first: the first holds cuDNN autotuning and
            # torch.compile, which on a GPU can cost more than a short run's training.
            "samples_per_s_steady": (float(np.median(window_rates[1:]))
                                     if len(window_rates) > 1 else None),
            "resumed_from_step": resumed_from, "nodes": hosts,
            "duration_s": time.perf_counter() - t_start, "dataset": cfg.dataset,
            "model": cfg.model, "precision": precision, "threads_per_process": env.threads,
        }
        # The final model, weights only, with what rebuilds it (torchrig-eval, README);
        # before summary.json, which says the run is complete.
        export.save_model(run_dir, raw_model, {
            "model": cfg.model, "dataset": cfg.dataset, "num_classes": data.num_classes,
            "classes": data.classes, "input_shape": list(data.test_x.shape[1:]),
            "mean": data.mean, "std": data.std, "accuracy": result[1], "loss": result[0],
            "held_out_samples": len(data.test_y), "steps": step, "epochs": cfg.epochs,
            "precision": precision, "seed": cfg.seed, "torch": torch.__version__,
        })
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        try:
            plot_metrics(out.metrics, run_dir / "metrics.png")
        except ImportError:
            log.info("matplotlib is not installed: no metrics.png")
        log.info("done: held-out accuracy %.4f, loss %.4f, %d steps, %.0f samples/s",
                 result[1], result[0], step, summary["samples_per_s"] or 0)
    return 0


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
        return train(cfg, env)
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
