"""Shared fixtures: the uninterrupted reference run, trained once per session; and a
check that the tests leave nothing in the checkout."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from launch import start_standalone
from torchrig import contract


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory) -> Path:
    """The uninterrupted 2-process run the other runs are compared with."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    launch = start_standalone(run_dir)
    assert launch.wait() == 0, launch.output()[-4000:]
    return run_dir


CHECKOUT = Path(__file__).resolve().parents[2]


def job_records(names: set[str]) -> list[str]:
    """Those of names that a job's processes write into their run directory: the contract's
    files, a worker's pid file and its note of an earlier failure."""
    return sorted(n for n in names if n in contract.FILES.values()
                  or n.startswith(("worker-rank", ".failure-", f".{contract.FILES['failure']}.")))


@pytest.fixture(scope="session", autouse=True)
def checkout_left_as_found():
    """A process started without a run directory of its own writes its records (a worker's
    failure record) into its working directory: the tests' processes must not use the checkout.
    Only those records count: make test runs lint beside, which keeps a cache in the checkout."""
    before = set(os.listdir(CHECKOUT))
    yield
    left = job_records(set(os.listdir(CHECKOUT)) - before)
    assert not left, f"the training tests left these in {CHECKOUT}: {left}"
