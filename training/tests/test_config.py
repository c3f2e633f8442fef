"""The configuration: flags, --config YAML and check_settings, all built from Config's fields."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from launch import child_env
from torchrig import config
from torchrig.config import DATASETS, MODELS, Config, check_settings, parse_config

CONFIG_PY = Path(config.__file__)


# --- flags and YAML -----------------------------------------------------------------

@pytest.mark.parametrize("argv, names", [
    (["--lr", "-1"], ["--lr", "> 0"]),
    (["--lr", "fast"], ["--lr", "a number"]),
    (["--batch-size", "0"], ["--batch-size", ">= 1"]),
    (["--epochs", "2.5"], ["--epochs", "an integer"]),
    (["--momentum", "1"], ["--momentum", "< 1"]),
    (["--dataset", "imagenet"], ["--dataset", "mnist5k", "cifar10"]),
    (["--model", "vit"], ["--model", "resnet18"]),
    (["--precision", "fp8"], ["--precision", "bf16"]),
])
def test_bad_flag_value_names_flag_and_allowed(argv, names, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_config(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    for name in names:
        assert name in err, err


def test_yaml_config_validated_and_overridden_by_flags(tmp_path: Path, capsys):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(yaml.safe_dump({"batch_size": 16, "lr": 0.01, "compile": True,
                                        "checkpoint-every": 7, "resume": False}))
    cfg = parse_config(["--config", str(cfg_file), "--lr", "0.5"])
    assert (cfg.batch_size, cfg.lr, cfg.compile, cfg.checkpoint_every, cfg.resume) == (
        16, 0.5, True, 7, False)

    for content, names in [({"batch_sise": 16}, ["batch_sise", "unknown key", "batch-size"]),
                           ({"lr": -2}, ["lr", "--lr", "> 0"]),
                           ({"optimizer": "lion"}, ["optimizer", "adamw", "sgd"]),
                           ({"compile": "yes"}, ["compile", "true or false"])]:
        cfg_file.write_text(yaml.safe_dump(content))
        with pytest.raises(SystemExit) as exc:
            parse_config(["--config", str(cfg_file)])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert all(n in err for n in names), err


def test_written_config_yaml_round_trips(tmp_path: Path):
    cfg = parse_config(["--lr", "0.003", "--no-resume", "--run-dir", str(tmp_path)])
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict()))
    assert parse_config(["--config", str(tmp_path / "config.yaml")]) == cfg


def test_cli_exit_code_and_help():
    run = [sys.executable, "-m", "torchrig.train"]
    bad = subprocess.run([*run, "--keep-checkpoints", "0"], capture_output=True, text=True,
                         timeout=120, env=child_env())
    assert bad.returncode == 2 and "--keep-checkpoints" in bad.stderr
    helped = subprocess.run([*run, "--help"], capture_output=True, text=True, timeout=120,
                            env=child_env())
    assert helped.returncode == 0
    for flag in ("--checkpoint-every", "--grad-accum", "--clip-grad", "--channels-last",
                 "--compile", "--config", "--run-dir", "--download"):
        assert flag in helped.stdout


def test_every_field_has_a_flag_with_its_default():
    assert parse_config([]) == Config()
    helped = config.build_parser().format_help()
    for f in dataclasses.fields(Config):
        assert config.flag_of(f) in helped and f.metadata["help"].split()[0] in helped


# --- check_settings -----------------------------------------------------------------

def test_check_settings_accepts_good_values():
    assert check_settings({}) == []
    assert check_settings({"dataset": "digits", "batch_size": 64, "lr": 0.01, "epochs": 3,
                           "seed": 0, "checkpoint_every": 0, "compile": True, "resume": False,
                           "momentum": "0.5", "run_dir": "/var/lib/x", "model": "resnet18",
                           "batch-size": 8}) == []


@pytest.mark.parametrize("values, message", [
    ({"epochs": 0}, "epochs must be an integer >= 1, got '0'"),
    ({"epochs": 2.5}, "epochs must be an integer (>= 1), got '2.5'"),
    ({"lr": -1}, "lr must be a number > 0, got '-1'"),
    ({"lr": "fast"}, "lr must be a number (> 0), got 'fast'"),
    ({"momentum": 1}, "momentum must be a number >= 0 and < 1, got '1'"),
    ({"keep_checkpoints": 0}, "keep_checkpoints must be an integer >= 1, got '0'"),
    ({"dataset": "imagenet"}, "dataset must be one of mnist5k, digits, synthetic, mnist, "
                              "fashion-mnist, cifar10, imagefolder, got 'imagenet'"),
    ({"optimizer": "lion"}, "optimizer must be one of adamw, sgd, got 'lion'"),
    ({"compile": "yes"}, "compile must be true or false, got 'yes'"),
    ({"batch-size": 0}, "batch-size must be an integer >= 1, got '0'"),
    ({"data_dir": None}, "data_dir must be a single value, got None"),
    ({"epochs": [1, 2]}, "epochs must be a single value, got [1, 2]"),
    ({"synthetic_shape": "3x32"}, "synthetic_shape must be CxHxW with C 1 to 4 and H = W from "
                                  "8 to 256, e.g. 3x32x32, got '3x32'"),
    ({"synthetic_shape": "3x32x16"}, "synthetic_shape must be CxHxW with C 1 to 4 and H = W "
                                     "from 8 to 256, e.g. 3x32x32, got '3x32x16'"),
    ({"synthetic_samples": 4}, "synthetic_samples must be an integer >= 8, got '4'"),
])
def test_check_settings_says_what_is_allowed(values, message):
    assert check_settings(values) == [message]


def test_check_settings_unknown_key_and_one_message_per_bad_value():
    problems = check_settings({"foo": 1, "seed": -1, "epochs": 2, "model": "vit"})
    assert len(problems) == 3
    assert problems[0].startswith("unknown option 'foo'; known: dataset, data_dir, download, ")
    assert "batch_size" in problems[0] and problems[0].endswith("log_every")
    assert problems[1:] == ["seed must be an integer >= 0, got '-1'",
                            "model must be one of cnn, resnet18, got 'vit'"]


@pytest.mark.parametrize("field", [f for f in dataclasses.fields(Config)
                                   if not isinstance(f.default, bool)], ids=lambda f: f.name)
def test_check_settings_agrees_with_the_flag(field, capsys):
    """What check_settings passes the flag passes, and what it refuses the flag refuses."""
    for text in ("0", "1", "-1", "0.5", "1e-3", "x", "cifar10", "sgd", "bf16", str(field.default)):
        try:
            parse_config([config.flag_of(field), text])
            flag_ok = True
        except SystemExit:
            flag_ok = False
        capsys.readouterr()
        assert (check_settings({field.name: text}) == []) == flag_ok, (field.name, text)


def test_module_tuples():
    assert isinstance(DATASETS, tuple) and "mnist5k" in DATASETS
    assert isinstance(MODELS, tuple) and MODELS == ("cnn", "resnet18")


def test_loads_by_file_path_without_torch():
    """The controller's filter plugin loads config.py by path, outside the package, in a
    Python without torch; it may not register the module in sys.modules."""
    code = f"""
import importlib.util, json, sys
sys.modules["torch"] = None  # any import of torch now fails
spec = importlib.util.spec_from_file_location("torchrig_config", {str(CONFIG_PY)!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
ours = [m for m in sys.modules if m.split(".")[0] in ("torchrig", "torchrig_config")]
problems = module.check_settings({{"epochs": 0, "dataset": "digits"}})
print(json.dumps([problems, list(module.DATASETS), ours]))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=child_env())
    assert done.returncode == 0, done.stderr
    problems, datasets, imported = json.loads(done.stdout)
    assert problems == ["epochs must be an integer >= 1, got '0'"]
    assert datasets == list(DATASETS) and imported == []


def test_a_jobs_staged_data_is_the_default_data_dir(monkeypatch, tmp_path):
    from torchrig.contract import ENV

    monkeypatch.delenv(ENV["data_dir"], raising=False)
    assert parse_config([]).data_dir == "data"
    monkeypatch.setenv(ENV["data_dir"], "/var/lib/torchrig/data/abc")
    assert parse_config([]).data_dir == "/var/lib/torchrig/data/abc"
    # --config and the flag still win.
    cfg = tmp_path / "c.yaml"
    cfg.write_text("data-dir: /elsewhere\n")
    assert parse_config(["--config", str(cfg)]).data_dir == "/elsewhere"
    assert parse_config(["--data-dir", "/mine"]).data_dir == "/mine"
