"""`make lint` reads the whole tree: every tracked Python file is one ruff checks, every
tracked YAML file one yamllint checks (molecule's scripts and playbooks/files included)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent


def tracked(*patterns: str) -> set[str]:
    out = subprocess.run(["git", "ls-files", "--", *patterns], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout
    return {line for line in out.splitlines() if (REPO / line).exists()}


def listed(cmd: list[str]) -> set[str]:
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True).stdout
    return {str(Path(line).resolve().relative_to(REPO)) for line in out.splitlines()
            if line.strip()}


def test_the_lint_target_runs_ruff_and_yamllint_on_the_whole_tree() -> None:
    lint = re.search(r"^lint:.*\n((?:\t.*\n)+)", (REPO / "Makefile").read_text(), re.M)
    assert lint, "Makefile has no lint target"
    assert re.search(r"\bruff check \.$", lint.group(1), re.M), lint.group(1)
    assert re.search(r"\byamllint --strict \.$", lint.group(1), re.M), lint.group(1)


def test_ruff_checks_every_tracked_python_file() -> None:
    python = tracked("*.py")
    assert {"molecule/shared/probe.py", "playbooks/files/controller_python.py",
            "training/src/torchrig/train.py"} <= python
    missed = python - listed([str(VENV_BIN / "ruff"), "check", "--show-files", "."])
    assert not missed, f"ruff check . skips {sorted(missed)}"


def test_ruff_reads_the_training_packages_own_settings() -> None:
    out = subprocess.run([str(VENV_BIN / "ruff"), "check", "--show-settings",
                          "training/src/torchrig/train.py"], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout
    assert 'Settings path: "' + str(REPO / "training" / "pyproject.toml") + '"' in out


def test_yamllint_checks_every_tracked_yaml_file() -> None:
    yaml_files = tracked("*.yml", "*.yaml")
    missed = yaml_files - listed([str(VENV_BIN / "yamllint"), "--list-files", "."])
    assert not missed, f"yamllint . skips {sorted(missed)}"
