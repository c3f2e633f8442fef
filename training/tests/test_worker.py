"""torchrig.worker and torchrig.launch: how a job ends when a retry cannot help.

Real processes: the worker runs real scripts; the launcher is real torchrun waiting at a
real c10d rendezvous on loopback for a node that never comes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from launch import child_env, free_port
from torchrig import contract, launch, worker
from torchrig.contract import ENV

USAGE_SCRIPT = """\
import argparse
p = argparse.ArgumentParser()
p.add_argument("epochs", type=int)
p.add_argument("--batch_size", type=int, required=True)
p.parse_args()
"""


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def run_worker(tmp_path: Path, *args: str, env: dict | None = None, timeout: float = 60):
    env = {**child_env(), ENV["run_dir"]: str(tmp_path), **(env or {})}
    env.pop("TORCHELASTIC_RUN_ID", None)
    return subprocess.run([sys.executable, "-m", "torchrig.worker", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout)


def fatal(tmp_path: Path) -> dict:
    return json.loads((tmp_path / worker.FATAL_FILE).read_text())


def fatal_traceback(tmp_path: Path, kind: str, last_line: str) -> dict:
    """worker.FATAL_FILE of `kind`, holding a whole traceback that ends with `last_line`."""
    record = fatal(tmp_path)
    assert record["kind"] == kind
    assert record["lines"][0] == "Traceback (most recent call last):"
    assert record["lines"][-1] == last_line
    return record


def test_a_usage_error_is_recorded_with_its_lines(tmp_path):
    script = write(tmp_path / "train.py", USAGE_SCRIPT)
    done = run_worker(tmp_path, str(script), "10")
    assert done.returncode == 2
    record = fatal(tmp_path)
    assert record["kind"] == "usage error" and record["exit_status"] == 2
    assert record["lines"] == [
        "usage: train.py [-h] --batch_size BATCH_SIZE epochs",
        "train.py: error: the following arguments are required: --batch_size"]
    assert "not retried (it would fail the same way)" in done.stderr


def test_an_import_error_is_recorded_with_its_traceback(tmp_path):
    script = write(tmp_path / "train.py", "import torchrig_no_such_module\n")
    done = run_worker(tmp_path, str(script))
    assert done.returncode == 1
    fatal_traceback(tmp_path, "import error",
                    "ModuleNotFoundError: No module named 'torchrig_no_such_module'")


def test_a_missing_entry_module_is_fatal(tmp_path):
    done = run_worker(tmp_path, "-m", "torchrig_no_such_entry")
    assert done.returncode == 1
    assert fatal(tmp_path)["kind"] == "import error"


def test_any_other_failure_is_left_to_torchrun_to_retry(tmp_path):
    script = write(tmp_path / "train.py", "raise RuntimeError('the network blinked')\n")
    done = run_worker(tmp_path, str(script))
    assert done.returncode == 1
    assert "RuntimeError: the network blinked" in done.stderr
    assert not (tmp_path / worker.FATAL_FILE).exists()


def test_the_same_failure_on_the_retry_ends_the_job_with_its_traceback(tmp_path):
    """A bug in a script: the first failure is retried, the same one on the retry is not."""
    script = write(tmp_path / "train.py", """\
        def load(path):
            raise ValueError(f"no column 'label' in {path}")
        load("data.csv")
    """)
    first = run_worker(tmp_path, str(script))
    assert first.returncode == 1 and not (tmp_path / worker.FATAL_FILE).exists()
    second = run_worker(tmp_path, str(script))
    assert second.returncode == 1
    record = fatal_traceback(tmp_path, "ValueError, the same on a retry",
                             "ValueError: no column 'label' in data.csv")
    assert record["why"] == "not retried again (the retry failed the same way)"
    assert "the retry failed the same way" in second.stderr


def test_a_different_failure_on_the_retry_is_retried_again(tmp_path):
    script = write(tmp_path / "train.py", """\
        import pathlib
        n = pathlib.Path("attempt")
        n.write_text(str(int(n.read_text()) + 1) if n.exists() else "1")
        raise RuntimeError("attempt " + n.read_text())
    """)
    for _ in range(3):
        assert run_worker(tmp_path, str(script)).returncode == 1
    assert not (tmp_path / worker.FATAL_FILE).exists()


def test_a_failure_between_nodes_is_always_retried(tmp_path):
    """While a peer is away a collective fails the same way each time; it heals when the
    peer is back, so it is never ended early."""
    script = write(tmp_path / "train.py", """\
        class DistNetworkError(RuntimeError):
            pass
        raise DistNetworkError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer")
    """)
    for _ in range(3):
        assert run_worker(tmp_path, str(script)).returncode == 1
    assert not (tmp_path / worker.FATAL_FILE).exists()


def test_a_failure_noted_long_before_this_attempt_is_not_its_retry(tmp_path):
    """The same error in an earlier run of the job (the user re-ran it unchanged hours
    later) is not a failed retry: this attempt is retried once."""
    script = write(tmp_path / "train.py", "raise ValueError('bad')\n")
    assert run_worker(tmp_path, str(script)).returncode == 1
    note = tmp_path / ".failure-0.json"
    record = json.loads(note.read_text())
    note.write_text(json.dumps({**record, "time": record["time"] - worker.REPEAT_WINDOW_S - 1}))
    assert run_worker(tmp_path, str(script)).returncode == 1
    assert not (tmp_path / worker.FATAL_FILE).exists()


def test_the_script_gets_its_arguments_and_directory_on_the_path(tmp_path):
    write(tmp_path / "helper.py", "VALUE = 'from the script directory'\n")
    script = write(tmp_path / "train.py", """\
        import sys, helper
        print(sys.argv[1:], helper.VALUE, __name__)
    """)
    done = run_worker(tmp_path, str(script), "10", "--batch_size", "32")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['10', '--batch_size', '32'] from the script directory __main__"


def test_a_deterministic_failure_ends_the_launcher_without_a_retry(tmp_path):
    """Under torchrun the worker ends its parent (torchrun) with the contract's signal, which
    the job unit does not restart; here the parent is a shell that would otherwise go on."""
    script = write(tmp_path / "train.py", USAGE_SCRIPT)
    env = {**child_env(), ENV["run_dir"]: str(tmp_path), "TORCHELASTIC_RUN_ID": "t"}
    parent = subprocess.run(
        ["bash", "-c", f'"{sys.executable}" -m torchrig.worker "{script}"; echo parent went on'],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert parent.returncode in (-contract.fatal_signal(), 128 + contract.fatal_signal())
    assert "parent went on" not in parent.stdout
    assert fatal(tmp_path)["kind"] == "usage error"


def test_sigterm_before_a_plain_script_sets_a_handler_ends_it_with_status_0(tmp_path):
    """A stop during rendezvous or imports: killed by the signal, the worker counted as
    failed and torchrun restarted the group in the middle of the stop."""
    ready = tmp_path / "ready"
    script = write(tmp_path / "train.py", f"""\
        import pathlib, time
        pathlib.Path({str(ready)!r}).touch()
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-m", "torchrig.worker", str(script)], cwd=tmp_path,
                            env={**child_env(), ENV["run_dir"]: str(tmp_path)})
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def test_sigterm_is_kept_for_the_trainer(tmp_path):
    """torchrig.train reads the kept request (the contract's stop_requested) when it sets up."""
    os.environ.pop(worker.STOP_REQUESTED_ENV, None)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, worker._keep_sigterm)
        os.kill(os.getpid(), signal.SIGTERM)
        assert os.environ.get(worker.STOP_REQUESTED_ENV) == "1"
    finally:
        signal.signal(signal.SIGTERM, previous)
        os.environ.pop(worker.STOP_REQUESTED_ENV, None)


def test_missing_nodes_are_those_whose_address_did_not_join():
    nodes = launch.job_nodes("node1=10.0.0.1 node2=10.0.0.2 node3=10.0.0.3")
    assert nodes == {"node1": "10.0.0.1", "node2": "10.0.0.2", "node3": "10.0.0.3"}
    assert launch.missing_nodes(nodes, {"10.0.0.3"}, "10.0.0.1") == ["node2"]
    assert launch.missing_nodes(nodes, set(), "10.0.0.1") == ["node2", "node3"]


def test_a_rendezvous_that_times_out_ends_the_job_naming_the_missing_node(tmp_path):
    """Real torchrun through torchrig.launch: a 2-node job whose second node never comes.
    It ends with NODES_MISSING (not restarted by the unit) and launch.ENDED_FILE names node2."""
    env = {**child_env(), ENV["run_dir"]: str(tmp_path), ENV["job"]: "lonely",
           ENV["nodes"]: "node1=127.0.0.1 node2=127.0.0.2", ENV["local_addr"]: "127.0.0.1",
           ENV["join_timeout"]: "3"}
    script = write(tmp_path / "train.py", "print('never runs')\n")
    done = subprocess.run(
        [sys.executable, "-m", "torchrig.launch", "--nnodes=2", "--nproc-per-node=1",
         "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--rdzv-id=lonely",
         "--rdzv-conf=join_timeout=3,is_host=1", "--local-addr=127.0.0.1",
         "--module", "torchrig.worker", str(script)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == launch.NODES_MISSING, done.stderr[-3000:]
    assert "never runs" not in done.stdout
    ended = json.loads((tmp_path / launch.ENDED_FILE).read_text())
    assert ended["kind"] == "nodes missing" and ended["missing"] == ["node2"]
    assert "node2 did not join within 3 s" in done.stderr


def test_a_node_that_died_after_joining_is_named_missing():
    """In a 3-node job, node3 joined and then died: its stale heartbeat must not count,
    so the launcher names it (and not node2, which is alive) when the rendezvous times out."""
    from collections import namedtuple
    from datetime import datetime, timedelta

    node = namedtuple("node", "addr pid local_id")  # torch's _NodeDesc has these fields
    now = datetime(2026, 12, 4, 12, 0, 0)
    beats = {node("10.0.0.2", 41, 0): now - timedelta(seconds=3),
             node("10.0.0.3", 42, 0): now - timedelta(seconds=40)}
    alive = launch.alive_addresses(beats, now, timedelta(seconds=15))
    assert alive == {"10.0.0.2"}
    nodes = launch.job_nodes("node1=10.0.0.1 node2=10.0.0.2 node3=10.0.0.3")
    assert launch.missing_nodes(nodes, alive, "10.0.0.1") == ["node3"]


def test_job_arguments_stay_whole_and_rank_0_notes_its_node(tmp_path):
    """The job's extra arguments (a JSON list) follow the entry point's own arguments, quoted words
    whole; the output directory exists before the script runs; rank 0 of a torchrun job
    writes its note (worker.RANK0_FILE), which train.yml reads to find the node whose
    outputs go on top."""
    script = write(tmp_path / "train.py", """\
        import json, os, sys
        from torchrig.contract import ENV
        out = os.environ[ENV["output_dir"]]
        open(os.path.join(out, "args.json"), "w").write(json.dumps(sys.argv[1:]))
    """)
    output = tmp_path / "output"
    env = {ENV["args"]: json.dumps(["7", "two words"]), ENV["output_dir"]: str(output),
           "TORCHELASTIC_RUN_ID": "t", "RANK": "0"}

    def run_as(rank: str):  # type: ignore[no-untyped-def]
        return subprocess.run([sys.executable, "-m", "torchrig.worker", str(script), "first"],
                              cwd=tmp_path, env={**child_env(), ENV["run_dir"]: str(tmp_path),
                                                 **env, "RANK": rank},
                              capture_output=True, text=True, timeout=60)

    done = run_as("0")
    assert done.returncode == 0, done.stderr
    assert json.loads((output / "args.json").read_text()) == ["first", "7", "two words"]
    note = json.loads((tmp_path / worker.RANK0_FILE).read_text())
    assert note["node"] == os.uname().nodename and note["restart_count"] == 0

    # Any other rank leaves no note.
    (tmp_path / worker.RANK0_FILE).unlink()
    done = run_as("1")
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / worker.RANK0_FILE).exists()
