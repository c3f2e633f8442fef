"""Shared fixture: the uninterrupted reference run, trained once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from launch import start_standalone


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory) -> Path:
    """The uninterrupted 2-process run the other runs are compared with."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    launch = start_standalone(run_dir)
    assert launch.wait() == 0, launch.output()[-4000:]
    return run_dir
