"""The torchrun role's job logic: extra_args, their way through the job's environment
file, what comes back from the nodes (and the size limit), and the failure report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rolepy import ROOT, load

job = load("roles/torchrun/filter_plugins/torchrun_job.py", "torchrun_job")
CONTRACT = load("roles/torchrig/filter_plugins/torchrig_contract.py", "torchrig_contract").contract()
ENV, FILES = CONTRACT["env"], CONTRACT["files"]


# --- extra_args ---------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "expected"), [
    (["7", "two words"], ["7", "two words"]),            # -e '{"extra_args": ["7", "two words"]}'
    ([10, 2, "--batch_size", 32, 0.5], ["10", "2", "--batch_size", "32", "0.5"]),  # YAML numbers
    ("10 2 --batch_size 32", ["10", "2", "--batch_size", "32"]),
    ('7 "two words"', ["7", "two words"]),                # -e 'extra_args="7 \"two words\""'
    ("--name 'it''s' --empty ''", ["--name", "its", "--empty", ""]),
    ("", []),
    (None, []),
    ([], []),
])
def test_extra_args_as_a_list_or_a_string_with_quoted_words(value, expected):
    assert job.job_args(value) == expected
    assert job.args_problem(value) == ""


@pytest.mark.parametrize(("value", "message"), [
    ('7 "two words', "extra_args '7 \"two words' cannot be split into words: No closing quotation"),
    (["7", True], "extra_args item 2 is true, not a string or a number; quote it"),
    (["7", ["a"]], 'extra_args item 2 is ["a"], not a string or a number; quote it'),
    ({"epochs": 7}, 'extra_args must be a list of strings or one string, got {"epochs": 7}'),
])
def test_bad_extra_args_are_named(value, message):
    assert job.args_problem(value) == message
    with pytest.raises(ValueError):
        job.job_args(value)


def test_arguments_reach_the_script_whole_through_the_environment_file(tmp_path: Path):
    """The role writes the job's arguments as NAME="<JSON>" into the job's EnvironmentFile; inside double
    quotes systemd reads it as a POSIX shell does (systemd.exec), so a shell reads the
    file here, and torchrig.worker hands the script exactly the arguments given."""
    args = ["7", "two words", "it's \"quoted\"", "$HOME `id` \\n", "ünï", ""]
    env_file = tmp_path / "job.env"
    env_file.write_text(f"{ENV['args']}={job.env_value(json.dumps(args))}\n")
    script = tmp_path / "show.py"
    script.write_text("import json, os, sys\n"
                      f"print(json.dumps([sys.argv[1:], {ENV['args']!r} in os.environ]))\n")
    src = ROOT / "training" / "src"
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("TORCHELASTIC_RUN_ID", None)
    shown = subprocess.run(
        ["bash", "-c", f'set -a; . "{env_file}"; exec "{sys.executable}" -m torchrig.worker '
                       f'"{script}" first'],
        check=False, capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    # The entry point's own arguments first, then extra_args; none left in the environment.
    assert json.loads(shown.stdout) == [["first", *args], False]


def test_a_line_break_cannot_enter_the_environment_file():
    with pytest.raises(job.JobError, match="line break"):
        job.env_value(f"a\n{ENV['run_dir']}=/")


# --- what comes back ----------------------------------------------------------------------

def test_rank_0_is_the_node_with_the_newest_note():
    """Rank 0 moved from node1 to node2 at a restart: node2's note is newer."""
    assert job.newest_rank0(["node1", "node2", "node3"], [100.5, 130.0, ""]) == "node2"
    assert job.newest_rank0(["node1", "node2"], ["", ""]) == ""


# --- the failure report -------------------------------------------------------------------

JOURNAL = """\
2026-12-04T10:00:00.000000+00:00 node1 systemd[1]: Started torchrig-job@j.service - torchrig training job j.
2026-12-04T10:00:01.000000+00:00 node1 python[812]: torchrig: rank 0 local_rank 0 world_size 2
2026-12-04T10:00:02.000000+00:00 node1 python[812]: [rank0]: Traceback (most recent call last):
2026-12-04T10:00:02.000000+00:00 node1 python[812]: [rank1]: Traceback (most recent call last):
2026-12-04T10:00:02.000000+00:00 node1 python[812]: [rank0]:   File "/code/j/train.py", line 30, in <module>
2026-12-04T10:00:02.000000+00:00 node1 python[812]: [rank0]:     main()
2026-12-04T10:00:02.000000+00:00 node1 python[812]: [rank1]:   File "/code/j/train.py", line 30, in <module>
2026-12-04T10:00:02.000000+00:00 node1 python[812]: [rank0]:   File "/code/j/train.py", line 21, in main
2026-12-04T10:00:02.000000+00:00 node1 python[812]: [rank0]:     loss = model(x).sum() / batch
2026-12-04T10:00:02.000000+00:00 node1 python[812]: [rank0]: ZeroDivisionError: division by zero
2026-12-04T10:00:02.000000+00:00 node1 python[812]: [rank1]: RuntimeError: Connection closed by peer
2026-12-04T10:00:03.000000+00:00 node1 python[790]: Traceback (most recent call last):
2026-12-04T10:00:03.000000+00:00 node1 python[790]:   File "/opt/venv/torch/run.py", line 9, in main
2026-12-04T10:00:03.000000+00:00 node1 python[790]: torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
2026-12-04T10:00:03.000000+00:00 node1 python[790]: ============================================================
2026-12-04T10:00:03.000000+00:00 node1 python[790]: train.py FAILED
2026-12-04T10:00:04.000000+00:00 node1 systemd[1]: torchrig-job@j.service: Failed with result 'exit-code'.
"""


def test_the_report_shows_the_first_traceback_then_the_last_lines():
    lines = job.failure_lines(JOURNAL.splitlines(), tail=3)
    assert lines == [
        "First error in its journal:",
        "[rank0]: Traceback (most recent call last):",
        '[rank0]:   File "/code/j/train.py", line 30, in <module>',
        "[rank0]:     main()",
        '[rank0]:   File "/code/j/train.py", line 21, in main',
        "[rank0]:     loss = model(x).sum() / batch",
        "[rank0]: ZeroDivisionError: division by zero",
        "Last lines of its journal:",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
        "============================================================",
        "train.py FAILED",
    ]


def test_a_long_traceback_keeps_its_innermost_frames_and_a_chained_error():
    frames = [f'  File "m.py", line {i}, in f{i}' for i in range(40)]
    tb = (["Traceback (most recent call last):", *frames, "KeyError: 'x'", "",
           "During handling of the above exception, another exception occurred:", "",
           "Traceback (most recent call last):", '  File "m.py", line 99, in g',
           "ValueError: bad value", "after"])
    shown = job.first_traceback(tb, keep=6)
    assert shown[:2] == ["Traceback (most recent call last):", "  ..."]
    assert shown[-1] == "ValueError: bad value" and len(shown) == 7


def test_without_a_traceback_the_report_is_the_journal_tail():
    journal = [f"2026-12-04T10:00:0{i}.0+00:00 node2 python[9]: line {i}" for i in range(5)]
    assert job.failure_lines(journal, tail=2) == [
        "Last lines of its journal:", "line 3", "line 4"]
